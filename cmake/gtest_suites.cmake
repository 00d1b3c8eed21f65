# Registers a GoogleTest binary with ctest one suite at a time: one ctest test per
# suite, named like its filter (`LayoutTest.*`), which runs the suite's tests in one
# process through tests/support/run_suite.sh. Unit binaries use it (tests/CMakeLists.txt):
# their thousands of millisecond tests cost ctest a process each otherwise, most of the
# unit run (docs/building.md).
#
# Two modes:
#   include(gtest_suites) and ps_add_test_suites(TARGET LABEL TIMEOUT RUNNER): after each
#     build of TARGET, the binary lists its tests (--gtest_list_tests) and the list of
#     suites is written to a file that ctest reads, as gtest_discover_tests does per test.
#   cmake -D TEST_EXECUTABLE=... -D CTEST_FILE=... -D TEST_LABEL=... -D TEST_TIMEOUT=...
#     -D RUNNER=... -D WORKING_DIR=... -D SUITES_ROOT=... -P gtest_suites.cmake: that step.
#
# A suite's name is its ctest test's name, so two binaries with a suite of one name would
# register two tests of one name, which ctest runs without a word: the step fails the
# build instead when another binary's list (a *_suites.cmake under SUITES_ROOT, the build
# tree) has a suite of this binary's, naming both.

if(CMAKE_SCRIPT_MODE_FILE)
  cmake_policy(VERSION 3.25)
  execute_process(COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests
    WORKING_DIRECTORY "${WORKING_DIR}" TIMEOUT 60
    OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${TEST_EXECUTABLE} --gtest_list_tests failed (${rc}):\n${listing}${errors}")
  endif()
  string(REPLACE ";" "\\;" listing "${listing}")
  string(REPLACE "\n" ";" lines "${listing}")
  set(script "")
  set(names "")
  foreach(line IN LISTS lines)
    # A suite's line: its name and a dot at the start of the line, perhaps a comment after
    # ("Typed/0.  # TypeParam = int"); its tests' lines are indented.
    if(line MATCHES "^([^ #]+)\\.(  #.*)?$")
      set(suite "${CMAKE_MATCH_1}")
      set(name "${suite}.*")
      string(APPEND script
        "add_test([==[${name}]==] \"${RUNNER}\" \"${TEST_EXECUTABLE}\" [==[--gtest_filter=${name}]==])\n"
        "set_tests_properties([==[${name}]==] PROPERTIES WORKING_DIRECTORY \"${WORKING_DIR}\""
        " LABELS \"${TEST_LABEL}\" TIMEOUT ${TEST_TIMEOUT} SKIP_RETURN_CODE 77)\n")
      list(APPEND names "${name}")
    endif()
  endforeach()
  if(NOT names)
    message(FATAL_ERROR "${TEST_EXECUTABLE} lists no test suite:\n${listing}")
  endif()
  file(GLOB_RECURSE others "${SUITES_ROOT}/*_suites.cmake")
  foreach(other IN LISTS others)
    if(other STREQUAL CTEST_FILE)
      continue()
    endif()
    file(STRINGS "${other}" added REGEX "^add_test\\(")
    foreach(line IN LISTS added)
      if(line MATCHES "^add_test\\(\\[==\\[([^]]+)\\]==\\] \"[^\"]*\" \"([^\"]*)\"")
        if(CMAKE_MATCH_1 IN_LIST names)
          message(FATAL_ERROR "Test suite ${CMAKE_MATCH_1} is in ${TEST_EXECUTABLE} and in "
            "${CMAKE_MATCH_2} (${other}): ctest would run two tests of one name. Rename one "
            "of the suites (or delete ${other} if that binary is no longer built).")
        endif()
      endif()
    endforeach()
  endforeach()
  # Whole or not at all, for a binary's step reading it while it is written.
  file(WRITE "${CTEST_FILE}.tmp" "${script}")
  file(RENAME "${CTEST_FILE}.tmp" "${CTEST_FILE}")
  return()
endif()

function(ps_add_test_suites target)
  cmake_parse_arguments(ARG "" "LABEL;TIMEOUT;RUNNER" "" ${ARGN})
  set(ctest_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_include.cmake")
  add_custom_command(TARGET ${target} POST_BUILD
    BYPRODUCTS "${ctest_file}"
    COMMAND "${CMAKE_COMMAND}" -D "TEST_EXECUTABLE=$<TARGET_FILE:${target}>"
      -D "CTEST_FILE=${ctest_file}" -D "TEST_LABEL=${ARG_LABEL}" -D "TEST_TIMEOUT=${ARG_TIMEOUT}"
      -D "RUNNER=${ARG_RUNNER}" -D "WORKING_DIR=${CMAKE_CURRENT_BINARY_DIR}"
      -D "SUITES_ROOT=${CMAKE_BINARY_DIR}"
      -P "${PROJECT_SOURCE_DIR}/cmake/gtest_suites.cmake"
    VERBATIM)
  file(WRITE "${include_file}"
    "if(EXISTS \"${ctest_file}\")\n"
    "  include(\"${ctest_file}\")\n"
    "else()\n"
    "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()
