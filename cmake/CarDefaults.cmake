# Project-wide compile settings: warnings, sanitizers, and the per-file ISA flags used by SIMD kernels.

add_compile_options(-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align -Wnull-dereference
                    -Wimplicit-fallthrough -Wno-unused-parameter)
if(CAR_WERROR)
  add_compile_options(-Werror)
endif()

# Clang's thread-safety analysis over the CAR_GUARDED_BY / CAR_REQUIRES annotations; a violation fails the
# build. scripts/thread-safety.sh builds the annotated libraries this way (CI).
if(CAR_THREAD_SAFETY)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "CAR_THREAD_SAFETY needs clang (e.g. -DCMAKE_CXX_COMPILER=clang++-14)")
  endif()
  add_compile_options(-Wthread-safety -Werror=thread-safety)
endif()

if(CAR_SANITIZE)
  add_compile_options(-fsanitize=${CAR_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${CAR_SANITIZE})
endif()

# car_simd_source(FILE ISA): compile one kernel file for an instruction set; the runtime dispatcher decides
# whether it is ever called, so the rest of the program stays runnable on any x86-64.
# -ffp-contract=off: these files reproduce exact operation orders (the scalar references', llama.cpp's), and
# every FMA they mean is written as one; with -mfma GCC would otherwise fuse a written multiply and add (it
# fused attention_avx2.cpp's softmax sum `sum * ms + vs`, which the scalar reference and llama.cpp's CPU
# build round twice: a last-bit difference that moved deepseek2's logprobs by up to 6.5e-2, issue #27).
# -falign-loops=64: every loop of a kernel file starts on a cache line. The hot loops are long (the one-vector
# Q4_K kernel's block loop is 1.7 KB) and their speed moved with where an unrelated edit to the same file
# happened to place them: gemv_interleaved<1> compiled to the same instructions 16 bytes further along ran
# dense-1b decode 4-17 % slower in four alternated rounds (car bench -p 0 -n 64, 2026-12-07); aligned, the two
# builds' rounds overlap again. It costs ~10 KB of padding in `car`.
set(CAR_FLAGS_AVX2 "-mavx2;-mfma;-mf16c;-mbmi2;-ffp-contract=off;-falign-loops=64")
set(CAR_FLAGS_AVX512 "${CAR_FLAGS_AVX2};-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512vnni;-mavx512bf16")
function(car_simd_source file isa)
  set_source_files_properties(${file} PROPERTIES COMPILE_OPTIONS "${CAR_FLAGS_${isa}}")
endfunction()

# CAR_TEST_COMPILE_OPTIONS: extra options for the test executables', the two programs' and the serving
# libraries' files (car_daemon, car_protocol, car_config, car_openai: CMakeLists.txt). scripts/test.sh
# --sanitize passes -O0: GoogleTest-heavy test files, the CLI11-heavy `car` files and the Asio / JSON-heavy
# daemon are most of a sanitizer build's compile time and half of it goes to -O1's optimisation, while the
# code that runs long in the tests (kernels, engine, cache) is in the other libraries, which stay at -O1.
# -O0 removes nothing a sanitizer checks (every access stays instrumented).
set(CAR_TEST_COMPILE_OPTIONS "" CACHE STRING
    "Extra compile options for the test executables, car, car-inferenced and the serving libraries")

# CAR_UNITY_BUILD: car_unity_build(TARGET) compiles that target's files in batches of 8 (CMake's unity build).
# Used on the daemon, the chat interpreter, `car` and the test executables of several files (car_add_gtest),
# whose files each instantiate the same Asio / nlohmann_json / CLI11 / GoogleTest templates: a third to a half
# of their compile time from scratch (scripts/test.sh, CI), at the cost of recompiling a whole batch for a
# change to one file, so it is off unless asked for.
option(CAR_UNITY_BUILD "Compile the daemon, the chat interpreter, car and multi-file tests in unity batches" OFF)
function(car_unity_build target)
  if(CAR_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
    # A batch includes its .cpp files, so g++ 12 takes them for headers and warns that a coroutine frame
    # holding a type of the file's anonymous namespace has no linkage - true of every coroutine that does, and
    # harmless when the file is its own translation unit, as it is in every other build.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      target_compile_options(${target} PRIVATE -Wno-subobject-linkage)
    endif()
  endif()
endfunction()

# car_add_gtest(NAME SOURCES... LIBS ...): one test executable registered with ctest test by test.
function(car_add_gtest name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_compile_options(${name} PRIVATE ${CAR_TEST_COMPILE_OPTIONS})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock Threads::Threads)
  target_compile_definitions(${name} PRIVATE CAR_DEFAULT_CONFORMANCE_DIR="${CAR_DEFAULT_CONFORMANCE_DIR}"
                                             CAR_BINARY_DIR="${CMAKE_BINARY_DIR}")
  if(TARGET car_test_pch)
    target_precompile_headers(${name} REUSE_FROM car_test_pch)
  endif()
  # CAR_UNITY_BUILD: a test executable of several files is one translation unit (they share the GoogleTest,
  # JSON and module templates they instantiate): half their compile time in each of CI's builds. Their
  # file-local names are therefore unique across the executable's files.
  list(LENGTH T_SOURCES n_sources)
  if(n_sources GREATER 1)
    car_unity_build(${name})
    set_target_properties(${name} PROPERTIES UNITY_BUILD_BATCH_SIZE 0)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
endfunction()
