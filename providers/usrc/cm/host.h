// The process's connection manager and its link to the host (docs/cm.md):
// the GSI demux, the service registry, the thread that receives MADs and
// runs the CM's timers. Made on the first open of the emulated rdma_cm.
#pragma once

#include "usrc/cm/cm.h"

namespace usrc::cm {

// The process's Cm, started on first use; nullptr (and *err) if it cannot
// be (no registry directory, no slot).
Cm *process_cm(int *err);

}  // namespace usrc::cm
