# The layering of docs/ARCHITECTURE.md, checked at configure time: server/, client/ and load_tests/
# (and the fake engine) reach the model through model/api and model/io only. None of their libraries
# may link the engine (maskd_model), the kernels or LibTorch, directly or through another library;
# programs (maskd, maskbench) are where the real engine is linked in. maskctl is checked as well: its
# model subcommands load the engine at run time from libmaskctl_model.so (client/CMakeLists.txt).
function(maskd_check_torch_free)
  foreach(root IN LISTS ARGN)
    set(seen "")
    set(todo ${root})
    set(path_of_${root} ${root})
    while(todo)
      list(POP_FRONT todo t)
      if(t IN_LIST seen)
        continue()
      endif()
      list(APPEND seen ${t})
      if(t MATCHES "^(maskd_model|maskd_model_internal|maskd_kernels|torch|torch_cpu|torch_cuda|torch_library|c10|c10_cuda)$"
         OR t MATCHES "(libtorch|libc10)[^/]*$")
        message(FATAL_ERROR "${root} reaches past model/api: ${path_of_${t}} (server/, client/ and "
                            "load_tests/ libraries must not link the engine or LibTorch; see "
                            "docs/ARCHITECTURE.md)")
      endif()
      if(NOT TARGET ${t})
        continue()
      endif()
      get_target_property(direct ${t} LINK_LIBRARIES)
      get_target_property(iface ${t} INTERFACE_LINK_LIBRARIES)
      foreach(dep IN LISTS direct iface)
        if(NOT dep OR dep MATCHES "-NOTFOUND$")
          continue()
        endif()
        # $<LINK_ONLY:x> and similar wrappers: look at what they wrap.
        string(REGEX REPLACE "^\\$<[A-Z_]+:(.*)>$" "\\1" dep "${dep}")
        if(NOT dep MATCHES "^\\$<" AND NOT dep IN_LIST seen)
          set(path_of_${dep} "${path_of_${t}} -> ${dep}")
          list(APPEND todo ${dep})
        endif()
      endforeach()
    endwhile()
  endforeach()
endfunction()
