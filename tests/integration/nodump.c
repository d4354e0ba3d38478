/* Preloaded into a test's target process: it refuses ptrace (and with it
 * process_vm_readv/writev and /proc/PID/fd, mem) to every process without
 * CAP_SYS_PTRACE, as a process handling secrets does. */
#include <sys/prctl.h>

__attribute__((constructor)) static void usrc_test_nodump(void) { prctl(PR_SET_DUMPABLE, 0); }
