# ps_target_warnings(target): warnings are errors in our own code (not in generated code).
function(ps_target_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Werror
    -Wno-unused-parameter -Wno-missing-field-initializers)
endfunction()
