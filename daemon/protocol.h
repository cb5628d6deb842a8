// The wire protocol between car-inferenced and its clients (CONTRACT.md "Wire protocol", docs/protocol.md):
// newline-delimited JSON over a Unix stream socket, one object per line each way, at most 1 MiB per line.
//
// This header gathers the protocol's parts, shared by the server (daemon/) and the `car` client (tools/),
// one concept per file under daemon/protocol/:
// - ops.h: the op table and the wire error codes;
// - framing.h: LineFramer, which cuts a byte stream into lines and reports over-long lines;
// - request.h: a line parsed into a Request (the compact fast path, the nesting bound);
// - schema.h: each op's known fields and the `infer` request parsed into InferParams;
// - results.h: token logprob entries and streamed token events, as types;
// - reply_lines.h: the reply and event lines the server writes;
// - reply_parser.h: a reply line parsed on the client's side.
// Everything there is pure (no I/O, no globals) and safe to use from any thread; a LineFramer is owned by
// one reader.
#pragma once

#include "daemon/protocol/framing.h"
#include "daemon/protocol/ops.h"
#include "daemon/protocol/reply_lines.h"
#include "daemon/protocol/reply_parser.h"
#include "daemon/protocol/request.h"
#include "daemon/protocol/results.h"
#include "daemon/protocol/schema.h"
