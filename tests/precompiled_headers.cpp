// tests/precompiled_headers.cpp: the one source of opreg_test_headers, the target that builds the
// precompiled header every test target shares (tests/CMakeLists.txt).
