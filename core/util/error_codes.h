// Every Error code the project produces, one row each: core, config, the daemon, the wire protocol and the
// `car` client all read this table, so each code is spelled once.
//
// A row is: constant, the code's text (stable snake_case: the wire protocol and tests match on it; never
// respell one), where it may appear, and a line saying what it means. `Reach` says where a code may go:
//   - kWire: sent to clients (docs/protocol.md lists these); an error reported by the runtime or the cache
//     with this code reaches the client as such.
//   - kWireDaemon: sent to clients, but only by the daemon's own front ends; the same code coming up from
//     the runtime or the cache is a bug and becomes `internal` (protocol::wire_code).
//   - kLocal: a detail of one module (a GGUF reader error, a settings error, a client-side failure); never
//     on the wire. The daemon maps it to a wire code (usually load_failed or bad_request, else internal).
// Everything here is constant data: safe from any thread.
#pragma once

#include <string_view>

namespace car {

/// Where an error code may go (see the table).
enum class Reach { kWire, kWireDaemon, kLocal };

// clang-format off
#define CAR_ERROR_CODES(X)                                                                                     \
  /* the wire protocol (docs/protocol.md, "Error codes") */                                                   \
  X(kBadRequest, "bad_request", kWire, "the request is malformed or a field is ill-typed or out of range")    \
  X(kUnknownOp, "unknown_op", kWireDaemon, "the request's op is not one the daemon knows")                     \
  X(kNotFound, "not_found", kWire, "no such model file (or any file a path names)")                           \
  X(kForbidden, "forbidden", kWire, "the model id could name a file outside the models directory")            \
  X(kLoadFailed, "load_failed", kWire, "the file is not a model the engine can load, or it does not fit")     \
  X(kContextOverflow, "context_overflow", kWire, "prompt tokens + max_tokens exceed the model's context")      \
  X(kCancelled, "cancelled", kWire, "the request (or a render) was cancelled")                                \
  X(kShuttingDown, "shutting_down", kWire, "the daemon is stopping and takes no new work")                    \
  X(kInternal, "internal", kWireDaemon, "a bug or an unexpected failure")                                      \
  X(kBusy, "busy", kWire, "the worker pool's queue is full; retry later")                                     \
  X(kIoError, "io_error", kWire, "a file could not be read (changed under its mapping, a streamed expert)")    \
  X(kTooManyConnections, "too_many_connections", kWireDaemon, "past a connection cap; then the close")        \
  X(kLineTimeout, "line_timeout", kWireDaemon, "a request line stayed incomplete too long; then the close")    \
  X(kOutputOverflow, "output_overflow", kWireDaemon, "a stream was cancelled: the client did not read it")     \
  X(kDeadlineExceeded, "deadline_exceeded", kWireDaemon, "the request's deadline_ms passed before it started")   \
  /* core/gguf: the GGUF reader and writer */                                                                  \
  X(kGgufBadMagic, "gguf_bad_magic", kLocal, "the file does not start with GGUF")                             \
  X(kGgufBadVersion, "gguf_bad_version", kLocal, "a GGUF version other than 2 and 3")                          \
  X(kGgufTruncated, "gguf_truncated", kLocal, "a read past the end of the file")                              \
  X(kGgufBadValueType, "gguf_bad_value_type", kLocal, "an unknown or invalid metadata value type")            \
  X(kGgufTooLarge, "gguf_too_large", kLocal, "a count or length no file of this size holds")                  \
  X(kGgufDuplicateKey, "gguf_duplicate_key", kLocal, "a metadata key appears twice")                          \
  X(kGgufBadAlignment, "gguf_bad_alignment", kLocal, "general.alignment is not a power-of-two uint32")        \
  X(kGgufBadDims, "gguf_bad_dims", kLocal, "n_dims 0 or > 4, a zero dimension, or a size overflow")           \
  X(kGgufUnknownType, "gguf_unknown_type", kLocal, "an unknown ggml tensor type id")                          \
  X(kGgufBadShape, "gguf_bad_shape", kLocal, "a row length that is not a multiple of the block size")         \
  X(kGgufDuplicateTensor, "gguf_duplicate_tensor", kLocal, "a tensor name appears twice")                     \
  X(kGgufMisaligned, "gguf_misaligned", kLocal, "a tensor's data offset is not aligned")                      \
  X(kGgufOutOfBounds, "gguf_out_of_bounds", kLocal, "a tensor's data lies past the end of the file")          \
  X(kGgufOverlap, "gguf_overlap", kLocal, "two tensors' data overlap")                                        \
  X(kGgufTypeMismatch, "gguf_type_mismatch", kLocal, "a metadata key holds another value type than asked")    \
  X(kGgufMissingKey, "gguf_missing_key", kLocal, "a required metadata key is missing")                        \
  /* core/tokenizer */                                                                                         \
  X(kTokenizerMissingKey, "tokenizer_missing_key", kLocal, "the file lacks a tokenizer key it needs")         \
  X(kTokenizerBadValue, "tokenizer_bad_value", kLocal, "a tokenizer key holds an unusable value")             \
  X(kTokenizerUnknownModel, "tokenizer_unknown_model", kLocal, "a tokenizer.ggml.model we do not implement")  \
  X(kTokenizerUnknownPre, "tokenizer_unknown_pre", kLocal, "a tokenizer.ggml.pre we do not implement")        \
  X(kTokenizerBadRegex, "tokenizer_bad_regex", kLocal, "a pre-tokenizer regex PCRE2 refuses")                 \
  /* core/chat: chat templates */                                                                              \
  X(kTemplateSyntax, "template_syntax", kLocal, "a chat template does not parse")                             \
  X(kTemplateError, "template_error", kLocal, "a chat template failed while rendering")                       \
  X(kRaiseException, "raise_exception", kLocal, "a chat template rejected the conversation")                  \
  X(kBadMessages, "bad_messages", kLocal, "a conversation's messages are malformed")                          \
  X(kNoChatTemplate, "no_chat_template", kLocal, "the model has no chat template and none was given")         \
  /* core/synth: synthetic models */                                                                           \
  X(kBadSpec, "bad_spec", kLocal, "a synthetic model spec is invalid")                                        \
  X(kBadWeightType, "bad_weight_type", kLocal, "an unknown weight type name")                                 \
  X(kUnsupportedType, "unsupported_type", kLocal, "the writer cannot produce this tensor type")               \
  X(kBadShape, "bad_shape", kLocal, "a tensor's row length does not fit its block size")                      \
  /* config: settings */                                                                                       \
  X(kConfigFile, "config_file", kLocal, "an environment/config file cannot be read or parsed")                \
  X(kInvalidSetting, "invalid_setting", kLocal, "a setting's value is invalid or out of range")               \
  X(kUnknownSetting, "unknown_setting", kLocal, "a setting name that does not exist")                         \
  X(kBadFlag, "bad_flag", kLocal, "a command-line flag the parser refuses")                                    \
  X(kHelp, "help", kLocal, "not a failure: --help and friends; the message is the text to print")             \
  /* daemon: start-up and peers */                                                                             \
  X(kListenFailed, "listen_failed", kLocal, "the daemon cannot open its socket")                              \
  X(kActivationFailed, "activation_failed", kLocal, "systemd socket activation passed unusable sockets")      \
  X(kBadGroup, "bad_group", kLocal, "CAR_INFERENCE_SOCKET_GROUP names no usable group")                       \
  X(kPeerCredentials, "peer_credentials", kLocal, "SO_PEERCRED failed on a connection")                       \
  /* the client side (daemon/client.h, car) */                                                                 \
  X(kConnectFailed, "connect_failed", kLocal, "the client cannot connect to the daemon")                      \
  X(kClosed, "closed", kLocal, "the daemon closed the connection")                                            \
  X(kProtocolError, "protocol_error", kLocal, "the daemon sent a line the client does not understand")
// clang-format on

/// The codes as constants: `make_error(errc::kIoError, ...)`, `e.code == errc::kNotFound`.
namespace errc {
#define CAR_ERROR_CODE_CONSTANT(constant, name, reach, meaning) inline constexpr const char* constant = name;
CAR_ERROR_CODES(CAR_ERROR_CODE_CONSTANT)
#undef CAR_ERROR_CODE_CONSTANT
}  // namespace errc

/// One row of the table.
struct ErrorCodeInfo {
  std::string_view name;
  Reach reach;
  std::string_view meaning;
};

inline constexpr ErrorCodeInfo kErrorCodes[] = {
#define CAR_ERROR_CODE_ROW(constant, name, reach, meaning) {name, Reach::reach, meaning},
    CAR_ERROR_CODES(CAR_ERROR_CODE_ROW)
#undef CAR_ERROR_CODE_ROW
};

/// The row for `name`, or nullptr for a code not in the table.
constexpr const ErrorCodeInfo* find_error_code(std::string_view name) {
  for (const ErrorCodeInfo& row : kErrorCodes) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

}  // namespace car
