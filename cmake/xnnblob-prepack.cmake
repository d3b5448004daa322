# xnnblob_prepack(): packed-weight caches made at build time, one per CPU class an app ships to,
# so that the app's first launch on a device packs nothing (issue 40). Shipped in xnnblob's CMake
# package (find_package(xnnblob) defines it); an in-tree build may include this file directly.
#
#   xnnblob_prepack(<target>
#                   PROGRAM <model.pte>
#                   [DATA <model.ptd>...]
#                   CPUS <class>...            # `xnnblob prepack --list-classes`, or host
#                   [DESTINATION <dir>])       # default: share/<target>/xnnblob-bundle
#
# Adds a build step that runs `xnnblob prepack` whenever the program or its data change, writing
# <binary dir>/<target>-xnnblob-bundle/<stem>.<class>.xbc; <target> depends on it, the
# directory is the target's XNNBLOB_BUNDLE_DIR property, and `cmake --install` puts the files in
# DESTINATION. Give the directory to xnnblob's backend option packed_cache_layers (beside
# packed_cache_path), or to `xnnblob run --cache-layer`.
#
# Cache variables:
#   XNNBLOB_COMMAND          the xnnblob command for this build host (the package sets it to its
#                            own bin/xnnblob when that is built for the host)
#   XNNBLOB_AARCH64_COMMAND  xnnblob built for aarch64, run under qemu-aarch64 for the aarch64
#                            classes (the package sets it when it is the aarch64 install)
include_guard(GLOBAL)

set(XNNBLOB_COMMAND "${XNNBLOB_COMMAND}" CACHE FILEPATH
    "the xnnblob command that runs on this build host (xnnblob_prepack)")
set(XNNBLOB_AARCH64_COMMAND "${XNNBLOB_AARCH64_COMMAND}" CACHE FILEPATH
    "xnnblob built for aarch64, for the aarch64 classes of xnnblob_prepack")

function(xnnblob_prepack target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "PROGRAM;DESTINATION" "DATA;CPUS")
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "xnnblob_prepack(${target}): unknown arguments ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT TARGET ${target})
    message(FATAL_ERROR "xnnblob_prepack: ${target} is not a target")
  endif()
  if(NOT ARG_PROGRAM OR NOT ARG_CPUS)
    message(FATAL_ERROR "xnnblob_prepack(${target}): PROGRAM and CPUS are required")
  endif()
  if(NOT XNNBLOB_COMMAND OR NOT EXISTS "${XNNBLOB_COMMAND}")
    message(FATAL_ERROR "xnnblob_prepack(${target}): XNNBLOB_COMMAND must name the xnnblob "
                        "command for this build host (it is '${XNNBLOB_COMMAND}')")
  endif()
  get_filename_component(program "${ARG_PROGRAM}" ABSOLUTE)
  get_filename_component(stem "${program}" NAME_WE)
  set(dir "${CMAKE_CURRENT_BINARY_DIR}/${target}-xnnblob-bundle")
  set(args prepack "${program}" --out "${dir}")
  set(depends "${program}")
  foreach(data IN LISTS ARG_DATA)
    get_filename_component(data "${data}" ABSOLUTE)
    list(APPEND args --data "${data}")
    list(APPEND depends "${data}")
  endforeach()
  set(outputs)
  set(aarch64 FALSE)
  foreach(cpu IN LISTS ARG_CPUS)
    list(APPEND args --cpu "${cpu}")
    list(APPEND outputs "${dir}/${stem}.${cpu}.xbc")
    if(cpu MATCHES "^aarch64-")
      set(aarch64 TRUE)
    endif()
  endforeach()
  if(aarch64)
    if(NOT XNNBLOB_AARCH64_COMMAND OR NOT EXISTS "${XNNBLOB_AARCH64_COMMAND}")
      message(FATAL_ERROR "xnnblob_prepack(${target}): aarch64 classes need "
                          "XNNBLOB_AARCH64_COMMAND, xnnblob built for aarch64")
    endif()
    list(APPEND args --aarch64-xnnblob "${XNNBLOB_AARCH64_COMMAND}")
  endif()
  add_custom_command(
    OUTPUT ${outputs}
    COMMAND "${XNNBLOB_COMMAND}" ${args}
    DEPENDS ${depends}
    COMMENT "xnnblob prepack ${stem} for ${ARG_CPUS}"
    VERBATIM)
  add_custom_target(${target}_xnnblob_bundle ALL DEPENDS ${outputs})
  add_dependencies(${target} ${target}_xnnblob_bundle)
  set_property(TARGET ${target} PROPERTY XNNBLOB_BUNDLE_DIR "${dir}")
  if(NOT ARG_DESTINATION)
    set(ARG_DESTINATION "share/${target}/xnnblob-bundle")
  endif()
  install(FILES ${outputs} DESTINATION "${ARG_DESTINATION}")
endfunction()
