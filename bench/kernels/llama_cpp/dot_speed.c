// llama.cpp's own dot kernels timed the way bench_kernels' Matvec/<type>/<isa>/256KiB/t1 times ours: one thread,
// rows of 4096 columns (16 quantized rows tiled to 256 KiB, so the matrix sits in L2), one activation row
// rounded to Q8_K, GiB/s of weight bytes. A development tool, not part of the build: it loads the ggml libraries
// of the reference harness (tests/reference/README.md) at run time.
//
//   cc -O2 -o /tmp/dot_speed bench/kernels/llama_cpp/dot_speed.c -ldl -lm
//   /tmp/dot_speed tests/reference/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64 haswell
//       iq3_xxs iq3_s iq2_xs iq2_s iq1_m tq1_0 tq2_0 iq2_xxs    (one command line)
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*vec_dot_fn)(int, float*, size_t, const void*, size_t, const void*, size_t, int);
typedef size_t (*quantize_fn)(const float*, void*, int64_t, int64_t, const float*);
typedef void (*q8k_fn)(const float*, void*, int64_t);

static const struct {
  const char* name;
  int id;
  size_t block_bytes;
} kTypes[] = {{"iq2_xxs", 16, 66}, {"iq2_xs", 17, 74}, {"iq3_xxs", 18, 98}, {"iq1_s", 19, 50},
              {"iq3_s", 21, 110},  {"iq2_s", 22, 82},  {"iq1_m", 29, 56},   {"tq1_0", 34, 54},
              {"tq2_0", 35, 66},   {"q4_K", 12, 144}};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float gauss(void) {
  double u = ((double)rand() + 1.0) / ((double)RAND_MAX + 2.0), v = (double)rand() / ((double)RAND_MAX + 1.0);
  return (float)(__builtin_sqrt(-2.0 * __builtin_log(u)) * __builtin_cos(6.283185307179586 * v));
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s LIBDIR CPU_VARIANT TYPE...\n", argv[0]);
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/libggml-base.so", argv[1]);
  void* base = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  snprintf(path, sizeof path, "%s/libggml-cpu-%s.so", argv[1], argv[2]);
  void* cpu = dlopen(path, RTLD_NOW);
  if (!base || !cpu) {
    fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  ((void (*)(void))dlsym(cpu, "ggml_cpu_init"))();
  void (*quantize_init)(int) = (void (*)(int))dlsym(base, "ggml_quantize_init");
  q8k_fn q8k = (q8k_fn)dlsym(cpu, "quantize_row_q8_K");
  enum { kCols = 4096, kDistinct = 16 };
  float x[kCols], ones[kCols];
  for (int j = 0; j < kCols; ++j) ones[j] = 1.0f;
  static uint8_t act[kCols / 256 * 292];
  for (int j = 0; j < kCols; ++j) x[j] = gauss();
  q8k(x, act, kCols);
  for (int a = 3; a < argc; ++a) {
    int t = -1;
    for (size_t k = 0; k < sizeof kTypes / sizeof kTypes[0]; ++k)
      if (!strcmp(kTypes[k].name, argv[a])) t = (int)k;
    if (t < 0) {
      fprintf(stderr, "unknown type %s\n", argv[a]);
      return 2;
    }
    char sym[64];
    snprintf(sym, sizeof sym, "quantize_%s", kTypes[t].name);
    quantize_fn quantize = (quantize_fn)dlsym(base, sym);
    snprintf(sym, sizeof sym, "ggml_vec_dot_%s_q8_K", kTypes[t].name);
    vec_dot_fn dot = (vec_dot_fn)dlsym(cpu, sym);
    const size_t rb = kCols / 256 * kTypes[t].block_bytes;
    const size_t rows = (256u << 10) / rb;
    uint8_t* w = aligned_alloc(64, (rows * rb + 63) / 64 * 64);
    quantize_init(kTypes[t].id);
    for (size_t r = 0; r < kDistinct; ++r) {
      float row[kCols];
      for (int j = 0; j < kCols; ++j) row[j] = gauss();
      quantize(row, w + r * rb, 1, kCols, ones);
    }
    for (size_t r = kDistinct; r < rows; ++r) memcpy(w + r * rb, w + (r % kDistinct) * rb, rb);
    float sink = 0.0f;
    size_t passes = 0;
    const double t0 = now();
    double t1 = t0;
    while (t1 - t0 < 0.5) {
      for (size_t r = 0; r < rows; ++r) {
        float s;
        dot(kCols, &s, 0, w + r * rb, 0, act, 0, 1);
        sink += s;
      }
      ++passes;
      t1 = now();
    }
    printf("llama.cpp %-8s %-8s %.3f GiB/s (%zu rows, sink %g)\n", argv[2], kTypes[t].name,
           (double)(passes * rows * rb) / (t1 - t0) / (1u << 30), rows, (double)sink);
    free(w);
  }
  return 0;
}
