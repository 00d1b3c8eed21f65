# cmake --install (docs/building.md, "Installing and linking against ps-server"):
#   bin/ps-server, bin/ps-admin
#   lib/libps_worker.a and every library of ours it links (found by walking its link
#     dependencies, so a library split off later is exported without a change here)
#   include/ps-server/: the public headers (PS_PUBLIC_HEADERS below) in the source layout
#   lib/cmake/PsServer/: PsServerConfig.cmake, its version file and the exported targets
#     PsServer::worker, PsServer::core, ... (find_package(PsServer))
#   lib/pkgconfig/ps-server.pc (pkg-config ps-server)
# Everything installed is relocatable: the package files find the prefix from where they
# lie, so `cmake --install build --prefix DIR` works for any DIR.
# tests/install/consumer_test.sh builds a project outside the tree against an install.
include(CMakePackageConfigHelpers)

set(PS_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/ps-server)
set(PS_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/PsServer)

# The libraries of this project that ps_worker links, directly or not (non-imported
# targets only; $<LINK_ONLY:...> is looked through), in link order: each library before
# the ones it depends on (the reverse of a depth-first post-order).
function(_ps_visit_links t)
  list(APPEND _ps_visited ${t})
  get_target_property(_links ${t} LINK_LIBRARIES)
  get_target_property(_ilinks ${t} INTERFACE_LINK_LIBRARIES)
  foreach(_item IN LISTS _links _ilinks)
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" _item "${_item}")
    if(NOT _item OR _item MATCHES "[$<>]" OR NOT TARGET ${_item})
      continue()
    endif()
    get_target_property(_aliased ${_item} ALIASED_TARGET)
    if(_aliased)
      set(_item ${_aliased})
    endif()
    get_target_property(_imported ${_item} IMPORTED)
    if(NOT _imported AND NOT _item IN_LIST _ps_visited)
      _ps_visit_links(${_item})
    endif()
  endforeach()
  list(PREPEND _ps_link_order ${t})
  set(_ps_visited "${_ps_visited}" PARENT_SCOPE)
  set(_ps_link_order "${_ps_link_order}" PARENT_SCOPE)
endfunction()
set(_ps_visited "")
set(_ps_link_order "")
_ps_visit_links(ps_worker)
set(PS_EXPORTED_LIBRARIES ${_ps_link_order})
message(STATUS "ps-server: installed libraries: ${PS_EXPORTED_LIBRARIES}")

# PsServer::<name without ps_>: PsServer::worker, PsServer::core, PsServer::codecs, ...
foreach(_t IN LISTS PS_EXPORTED_LIBRARIES)
  string(REGEX REPLACE "^ps_" "" _name ${_t})
  set_target_properties(${_t} PROPERTIES EXPORT_NAME ${_name})
endforeach()
# The public headers are C++20 (std::span): users of the installed package get the
# standard from PsServer::core (the build itself sets CMAKE_CXX_STANDARD).
set_property(TARGET ps_core APPEND PROPERTY INTERFACE_COMPILE_FEATURES
  $<INSTALL_INTERFACE:cxx_std_20>)

install(TARGETS ps-server ps-admin RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ${PS_EXPORTED_LIBRARIES} EXPORT PsServerTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Headers: this list and nothing else, in the source layout: worker_lib/worker.h and the
# headers it includes, none with gRPC or protobuf types, and gpu/cuda_device.h, where
# CudaDevice() went when it left core/device.h. The consumer test compiles them
# with only the prefix's include path (so a header missing here fails there) and refuses
# an installed header that names gRPC or protobuf. A header becomes public by being
# added here, never by lying in a folder.
set(PS_PUBLIC_HEADERS
  worker_lib/worker.h
  core/clock.h
  core/credentials.h
  core/data_plane.h
  core/device.h
  core/layout.h
  core/token_bucket.h
  gpu/cuda_device.h
  net/shaper.h)
foreach(_h IN LISTS PS_PUBLIC_HEADERS)
  get_filename_component(_dir ${_h} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${_h} DESTINATION ${PS_INSTALL_INCLUDEDIR}/${_dir})
endforeach()

# The CMake package.
install(EXPORT PsServerTargets NAMESPACE PsServer:: DESTINATION ${PS_INSTALL_CMAKEDIR})
# A build with CUDA: PsServerConfig.cmake looks for the same toolkit first.
if(PS_HAVE_CUDA)
  get_filename_component(PS_CUDA_TOOLKIT_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
endif()
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/PsServerConfig.cmake.in
  ${PROJECT_BINARY_DIR}/PsServerConfig.cmake
  INSTALL_DESTINATION ${PS_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/PsServerConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/PsServerConfig.cmake
  ${PROJECT_BINARY_DIR}/PsServerConfigVersion.cmake DESTINATION ${PS_INSTALL_CMAKEDIR})

# The pkg-config file: static libraries, so Libs and Requires list everything (plain
# `pkg-config --libs` is enough, no --static). The prefix is found from the .pc file's
# own place (${pcfiledir}), which pkg-config and pkgconf both provide.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(PS_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _ps_pc_up "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
  string(REGEX REPLACE "/$" "" _ps_pc_up "${_ps_pc_up}")
  set(PS_PC_PREFIX "\${pcfiledir}/${_ps_pc_up}")
endif()
set(PS_PC_LIBS "")
foreach(_t IN LISTS PS_EXPORTED_LIBRARIES)
  string(APPEND PS_PC_LIBS " -l${_t}")
endforeach()
# What our libraries link from outside: gRPC and protobuf (ps_proto, the transports),
# abseil, OpenSSL's libcrypto (crypto/: the cluster secret and the proofs) and libssl
# (the TCP data plane's TLS), zlib (codecs), Boost.Asio (headers only, in /usr/include),
# the threads library; the static CUDA runtime (gpu/, the codecs' kernels) in a build
# with CUDA.
set(PS_PC_REQUIRES "grpc++ protobuf absl_status absl_statusor absl_strings absl_str_format absl_synchronization absl_flat_hash_map libssl libcrypto zlib")
set(PS_PC_EXTRA_LIBS "-pthread -l${CMAKE_DL_LIBS}")
if(PS_HAVE_CUDA)
  get_target_property(_ps_cudart CUDA::cudart_static IMPORTED_LOCATION)
  set(PS_PC_EXTRA_LIBS "${_ps_cudart} -lrt ${PS_PC_EXTRA_LIBS}")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/ps-server.pc.in ${PROJECT_BINARY_DIR}/ps-server.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ps-server.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
