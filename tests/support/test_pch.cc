// The translation unit that builds the test binaries' shared precompiled header
// (ps_test_pch in tests/CMakeLists.txt); it has no code of its own.
