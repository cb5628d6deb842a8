// corpus_settings OUT_DIR: seeds for fuzz_settings that come from the settings table itself - the example
// environment file as `car-inferenced --print-env-example` prints it (every setting, commented out) and the
// same with every line that carries a default uncommented - so the seeds follow the rows instead of a copy
// written by hand. The hand-written malformed seeds stay in fuzz/settings/seeds/.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "config/settings.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: corpus_settings OUT_DIR\n");
    return 2;
  }
  const std::filesystem::path out = argv[1];
  std::filesystem::create_directories(out);
  const std::string example = car::config::settings_env_example();
  std::ofstream(out / "env-example", std::ios::binary) << example;
  std::istringstream in(example);
  std::string line;
  std::string uncommented;
  while (std::getline(in, line)) {
    // "#CAR_INFERENCE_X=value" -> "CAR_INFERENCE_X=value"; prose comments stay.
    if (line.rfind("#CAR_INFERENCE_", 0) == 0 && line.back() != '=') line.erase(0, 1);
    uncommented += line + "\n";
  }
  std::ofstream(out / "env-defaults", std::ios::binary) << uncommented;
  return 0;
}
