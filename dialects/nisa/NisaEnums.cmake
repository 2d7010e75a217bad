# Writes NisaEnumCases.td: the cases of the nisa dialect's enums (Engine,
# MemorySpace, ActivationFn, AluOp, Collective) in the order and spelling of
# runtime/program/InstructionSet.def, so the dialect's enums and the
# runtime's are one definition (the emitter converts between them by value).
# Included from CMakeLists.txt; CMake re-runs when the table changes.
set(NISA_ISA_DEF ${PROJECT_SOURCE_DIR}/runtime/program/InstructionSet.def)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${NISA_ISA_DEF})
file(STRINGS ${NISA_ISA_DEF} nisa_isa_lines
  REGEX "^NEURON_(ENGINE|MEMORY_SPACE|ACT_FUNC|ALU_OP|COLLECTIVE)\\(")
set(nisa_enum_td "// Generated from runtime/program/InstructionSet.def by NisaEnums.cmake.\n")
foreach(kind ENGINE MEMORY_SPACE ACT_FUNC ALU_OP COLLECTIVE)
  set(cases)
  set(value 0)
  foreach(line IN LISTS nisa_isa_lines)
    if(line MATCHES "^NEURON_${kind}\\([A-Za-z0-9]+, *\"([a-z0-9_]+)\"\\)")
      list(APPEND cases "  I32EnumAttrCase<\"${CMAKE_MATCH_1}\", ${value}>")
      math(EXPR value "${value} + 1")
    endif()
  endforeach()
  if(NOT cases)
    message(FATAL_ERROR "${NISA_ISA_DEF} has no NEURON_${kind} entries")
  endif()
  list(JOIN cases ",\n" cases)
  string(APPEND nisa_enum_td "defvar Nisa_${kind}_CASES = [\n${cases}\n];\n")
endforeach()
# Written only when it changes, so tablegen does not re-run for nothing.
file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/NisaEnumCases.td
  CONTENT "${nisa_enum_td}" @ONLY)
