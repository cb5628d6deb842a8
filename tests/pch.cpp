// The translation unit of car_test_pch (tests/CMakeLists.txt): the object library that precompiles the
// headers most test files include, once, for every test executable to reuse.
