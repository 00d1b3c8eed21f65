# Runs ${EXPERIMENT} --config ${CONFIG} --out ${OUT} (no plots) from a fresh ${OUT};
# fails with its output unless it exits 0. Its stdout is in ${out}. Included by the
# experiment smoke tests.
file(REMOVE_RECURSE ${OUT})
execute_process(COMMAND ${EXPERIMENT} --config ${CONFIG} --out ${OUT} --plots false
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ps-experiment failed (${rc}):\n${out}\n${err}")
endif()
