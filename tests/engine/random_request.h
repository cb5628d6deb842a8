// A random generation request for the batching tests (scheduler_test, batching_company_test): a prompt of
// 1..max_prompt random ids, 1..max_tokens tokens past EOS, logprobs with 0-2 top entries, and greedy or
// seeded sampling at `temperature` with even odds.
#pragma once

#include <cstdint>
#include <random>

#include "core/engine/generate_request.h"

namespace car::testing {

inline engine::GenerateRequest random_request(std::mt19937& rng, int64_t vocab, int max_prompt, int max_tokens,
                                              float temperature) {
  engine::GenerateRequest r;
  const int np = 1 + static_cast<int>(rng() % static_cast<uint32_t>(max_prompt));
  for (int i = 0; i < np; ++i) r.prompt_ids.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));
  r.max_tokens = 1 + static_cast<int>(rng() % static_cast<uint32_t>(max_tokens));
  r.ignore_eos = true;
  r.logprobs = true;
  r.top_logprobs = static_cast<int>(rng() % 3);
  if (rng() % 2 == 0) {
    r.sampling.temperature = 0;
  } else {
    r.sampling.temperature = temperature;
    r.sampling.seed = rng();
  }
  return r;
}

}  // namespace car::testing
