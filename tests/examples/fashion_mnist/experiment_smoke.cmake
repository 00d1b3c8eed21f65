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
# --select: a grid of one rule takes that rule's 2 cells out of the run; without --merge
# it is refused.
execute_process(COMMAND ${EXPERIMENT} --config ${CONFIG} --set "rules = [\"caf\"]" --merge ${OUT}
                        --select --out ${OUT}/selected --plots false
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "merged 2 of the grid's 2 cells from 1 run\\(s\\) \\(--select left out 2 rows")
  message(FATAL_ERROR "--merge --select did not take the rule's cells (${rc}):\n${out}\n${err}")
endif()
file(READ ${OUT}/selected/table.md selected_table)
if(selected_table MATCHES "`median`" OR NOT selected_table MATCHES "`caf`")
  message(FATAL_ERROR "--select kept another rule's rows:\n${selected_table}")
endif()
execute_process(COMMAND ${EXPERIMENT} --config ${CONFIG} --select --out ${OUT}/nothing
                        --plots false
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "--select picks the rows of --merge")
  message(FATAL_ERROR "--select without --merge was not refused (${rc}):\n${out}\n${err}")
endif()
# --resume after an interruption: with the first two cells' rows left in --out, only the
# other two run, and the table is the whole grid's.
set(RESUMED ${OUT}/resumed)
file(MAKE_DIRECTORY ${RESUMED})
file(STRINGS ${OUT}/summary.csv summary_lines)
list(SUBLIST summary_lines 0 3 kept)
list(JOIN kept "\n" kept)
file(WRITE ${RESUMED}/summary.csv "${kept}\n")
file(STRINGS ${OUT}/results.csv result_lines)
list(GET result_lines 0 header)
list(FILTER result_lines INCLUDE REGEX "^median,")
list(JOIN result_lines "\n" kept)
file(WRITE ${RESUMED}/results.csv "${header}\n${kept}\n")
execute_process(COMMAND ${EXPERIMENT} --config ${CONFIG} --out ${RESUMED} --resume --plots false
                RESULT_VARIABLE rc OUTPUT_VARIABLE resume_out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ps-experiment --resume failed (${rc}):\n${resume_out}\n${err}")
endif()
if(NOT resume_out MATCHES "resuming: 2 done before" OR resume_out MATCHES "\\[[12]/4\\]"
   OR NOT resume_out MATCHES "\\[4/4\\]")
  message(FATAL_ERROR "--resume ran other cells than the two missing:\n${resume_out}")
endif()
file(STRINGS ${RESUMED}/summary.csv resumed_summary)
list(LENGTH resumed_summary lines)
file(READ ${RESUMED}/table.md resumed_table)
if(NOT lines EQUAL 5 OR NOT resumed_table MATCHES "\\| `median` \\| 0 \\| step.*\\| `caf` \\| 0 \\| step")
  message(FATAL_ERROR "--resume did not report the whole grid:\n${resumed_table}")
endif()
# late_worst_case.py reads the run's evaluations: from step 10 on (both of them), one row
# per rule and f with the no-attack run and the worst attack scored the same way.
find_program(PYTHON3 python3 REQUIRED)
execute_process(COMMAND ${PYTHON3} ${LATE_WORST_CASE} ${OUT} 10
                RESULT_VARIABLE rc OUTPUT_VARIABLE late_out ERROR_VARIABLE err)
foreach(rule median caf)
  if(NOT rc EQUAL 0 OR NOT late_out MATCHES "\\| `${rule}` \\| 1 \\| 0\\.[0-9][0-9][0-9] \\| 0\\.[0-9][0-9][0-9] \\| alie_opt \\|")
    message(FATAL_ERROR "late_worst_case.py lacks the ${rule} row (${rc}):\n${late_out}\n${err}")
  endif()
endforeach()
