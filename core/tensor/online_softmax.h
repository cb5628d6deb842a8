// One step of the online softmax (Milakov and Gimelshein) that attend_head_scalar (attention.cpp) and
// attend_head_avx2 (attention_avx2.cpp) both run per key, so the two stay the same arithmetic: the score
// `s` of one more key is folded into the running maximum `mx`. When `s` is a new maximum, `ms` is the
// factor that rescales everything accumulated so far (exp(old max - s)) and this key's weight `vs` is 1;
// otherwise `ms` is 1 and `vs` is exp(s - mx). Returns whether the accumulator needs the `ms` rescale.
// online_sink_step folds in an attention sink (gpt-oss) after the last key the same way.
// Internal linkage (static): each kernel file compiles its own copy with its own ISA flags.
#pragma once

#include <cmath>

namespace car::tensor::detail {

static inline bool online_softmax_step(float s, float& mx, float& ms, float& vs) {
  ms = 1.0f;
  vs = 1.0f;
  if (s > mx) {
    const float old = mx;
    mx = s;
    ms = std::exp(old - mx);
    return true;
  }
  vs = std::exp(s - mx);
  return false;
}

/// An attention sink: a per-head logit `sink` that joins the softmax's denominator and contributes no value,
/// applied after the last key as ggml's flash attention applies it (ggml_compute_forward_flash_attn_ext_f16,
/// "sinks"): when it exceeds the running maximum `mx`, the accumulated values are scaled by the returned
/// factor exp(mx - sink) (on the float accumulator, after its fp16 -> fp32 conversion) and the sum with them;
/// else the sum gains exp(sink - mx). `sum` is updated.
static inline float online_sink_step(float sink, float mx, float& sum) {
  float ms = 1.0f;
  float vs = 1.0f;
  if (sink > mx) {
    ms = std::exp(mx - sink);
  } else {
    vs = std::exp(sink - mx);
  }
  sum = sum * ms + vs;
  return ms;
}

}  // namespace car::tensor::detail
