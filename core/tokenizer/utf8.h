// UTF-8 helpers with llama.cpp's exact leniency, and GPT-2's byte-to-unicode mapping.
//
// Tokenizers must treat text the way llama.cpp does, including malformed text, so these functions copy its
// rules rather than the strict ones of the standard: a lead byte's high nibble gives the sequence length
// (utf8_seq_len), a decoder accepts overlong forms and surrogates and replaces each byte it cannot decode
// with U+FFFD (decode_lenient). Code points above U+10FFFF are also replaced, so every decoded value can be
// encoded again. Byte-level BPE maps each byte to a printable code point (byte_to_unicode: 0x21..0x7E,
// 0xA1..0xAC and 0xAE..0xFF map to themselves, the other 68 bytes in order to U+0100..U+0143) before merging;
// unicode_to_byte is its inverse. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace car::tokenizer {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

/// Length of the sequence a byte starts, from its high nibble alone (1 for continuation bytes), as
/// llama.cpp's unicode_len_utf8: 0x0-0xB -> 1, 0xC-0xD -> 2, 0xE -> 3, 0xF -> 4.
inline size_t utf8_seq_len(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

/// Decodes `text` into code points: overlong forms and surrogates are accepted (as llama.cpp does); a byte
/// that starts no decodable sequence becomes one U+FFFD and decoding resumes at the next byte.
std::vector<uint32_t> decode_lenient(std::string_view text);

/// Appends the UTF-8 encoding of `cpt` (any value up to 0x10FFFF, surrogates included).
void append_utf8(std::string& out, uint32_t cpt);

/// The length of the longest prefix of `bytes` that consists of complete, valid UTF-8 sequences
/// (strict: no overlongs, surrogates or values above U+10FFFF).
size_t valid_utf8_prefix(std::string_view bytes);

/// How many trailing bytes of `bytes` form the valid start of a sequence that more bytes could complete
/// (0..3); 0 when `bytes` ends on a sequence boundary or in bytes that can never become valid.
size_t incomplete_utf8_tail(std::string_view bytes);

/// Replaces every invalid sequence with U+FFFD (strict validation, one U+FFFD per maximal invalid subpart).
std::string sanitize_utf8(std::string_view bytes);

/// GPT-2 byte-level mapping: the UTF-8 text of the code point byte `b` stands for.
const std::string& byte_to_unicode(uint8_t b);
/// The byte a code point stands for, or -1 if it stands for none.
int unicode_to_byte(uint32_t cpt);
/// Maps every byte of `bytes` through byte_to_unicode.
std::string byte_encode(std::string_view bytes);

}  // namespace car::tokenizer
