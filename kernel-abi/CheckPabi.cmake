# Configure-time check: the installed libibverbs must export the private
# provider ABI that kernel-abi/verbs_pabi34.h declares.
find_library(USRC_LIBIBVERBS NAMES ibverbs REQUIRED)
include(CheckCSourceCompiles)
set(CMAKE_REQUIRED_LIBRARIES ${USRC_LIBIBVERBS})
set(CMAKE_REQUIRED_QUIET ON)
check_c_source_compiles("
  extern int verbs_register_driver_34(const void *);
  __asm__(\".symver verbs_register_driver_34,verbs_register_driver_34@IBVERBS_PRIVATE_34\");
  int main(void) { return (int)(long)&verbs_register_driver_34; }
" USRC_HAVE_PABI34)
unset(CMAKE_REQUIRED_LIBRARIES)
if(NOT USRC_HAVE_PABI34)
  message(FATAL_ERROR
    "usrc: the installed libibverbs (${USRC_LIBIBVERBS}) does not export the "
    "private provider ABI IBVERBS_PRIVATE_34 (rdma-core 36 to 56). usrc "
    "declares that ABI in kernel-abi/verbs_pabi34.h; a libibverbs with another "
    "private ABI needs its own declaration file there.")
endif()
message(STATUS "usrc: libibverbs exports IBVERBS_PRIVATE_34")
