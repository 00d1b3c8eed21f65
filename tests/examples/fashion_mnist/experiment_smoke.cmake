# Runs ps-experiment on a tiny grid and checks its outputs: every cell ran, the table
# has the rules' rows, and results.csv has the evaluations.
include(${CMAKE_CURRENT_LIST_DIR}/run_experiment.cmake)
file(READ ${OUT}/table.md table)
foreach(rule median caf)
  if(NOT table MATCHES "\\| `${rule}` \\| 0 \\| step\\(every=10, gamma=0\\.5\\) \\| dirichlet\\(alpha=1\\) \\| fp32 \\| 0\\.[0-9]+ \\| 0\\.[0-9]+ \\| 0\\.[0-9]+ \\|")
    message(FATAL_ERROR "table.md lacks the ${rule} row:\n${table}")
  endif()
endforeach()
file(STRINGS ${OUT}/summary.csv summary)
list(LENGTH summary lines)
if(NOT lines EQUAL 5)
  message(FATAL_ERROR "summary.csv should have a header and 4 cells:\n${summary}")
endif()
file(STRINGS ${OUT}/results.csv results REGEX ",20,0\\.[0-9]+$")
list(LENGTH results evals)
if(NOT evals EQUAL 4)
  message(FATAL_ERROR "results.csv should have the final evaluation of every cell: ${results}")
endif()
if(NOT out MATCHES "\\[4/4\\]")
  message(FATAL_ERROR "no progress lines in the output:\n${out}")
endif()
# --merge reads the run back: the same grid reported again gives the same table.md, and
# a row of another grid is refused by name.
execute_process(COMMAND ${EXPERIMENT} --config ${CONFIG} --merge ${OUT} --out ${OUT}/merged
                        --plots false
                RESULT_VARIABLE rc OUTPUT_VARIABLE merge_out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ps-experiment --merge failed (${rc}):\n${merge_out}\n${err}")
endif()
file(READ ${OUT}/merged/table.md merged_table)
if(NOT merged_table STREQUAL table)
  message(FATAL_ERROR "--merge wrote another table.md:\n${merged_table}\nthe run's:\n${table}")
endif()
if(NOT merge_out MATCHES "merged 4 of the grid's 4 cells from 1 run")
  message(FATAL_ERROR "--merge did not say what it merged:\n${merge_out}")
endif()
execute_process(COMMAND ${EXPERIMENT} --config ${CONFIG} --set "seeds = [2]" --merge ${OUT}
                        --out ${OUT}/wrong --plots false
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "is not in this config's grid")
  message(FATAL_ERROR "--merge took rows of another grid (${rc}):\n${out}\n${err}")
endif()
