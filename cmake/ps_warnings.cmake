# ps_target_warnings(target): warnings are errors in our own code (not in generated code).
# GCC 12 at -O3 (CMAKE_BUILD_TYPE=Release) reports -Wrestrict, -Wstringop-overflow and
# -Wmaybe-uninitialized false positives inside libstdc++'s std::string (GCC bugs 105329
# and 105651; the last on a string member of an aggregate built with designated
# initializers, as ps-bench's WorkerOptions); they stay warnings rather than errors. CUDA sources get nvcc's own switch: every nvcc
# warning is an error, and the host compiler sees -Wall -Wextra.
function(ps_target_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror -Wno-unused-parameter -Wno-missing-field-initializers>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wno-error=restrict -Wno-error=stringop-overflow
        -Wno-error=maybe-uninitialized>)
    # In a unity batch every source is an included file, and GCC warns about any class
    # there with a member of a type from the file's anonymous namespace (a pimpl's state,
    # say), which is only a problem in a header that several files include.
    if(PS_UNITY_BUILD)
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-subobject-linkage>)
    endif()
  endif()
endfunction()
