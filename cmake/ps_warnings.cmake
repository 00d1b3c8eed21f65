# ps_target_warnings(target): warnings are errors in our own code (not in generated code).
# GCC 12 at -O3 (CMAKE_BUILD_TYPE=Release) reports -Wrestrict and -Wstringop-overflow
# false positives inside libstdc++'s std::string (GCC bugs 105329, 105651); they stay
# warnings there rather than errors. CUDA sources get nvcc's own switch: every nvcc
# warning is an error, and the host compiler sees -Wall -Wextra.
function(ps_target_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Werror -Wno-unused-parameter -Wno-missing-field-initializers>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wno-error=restrict -Wno-error=stringop-overflow>)
  endif()
endfunction()
