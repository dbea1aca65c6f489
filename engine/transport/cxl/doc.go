// Package cxl is the CXL memory transport: engines that map the same CXL
// memory device (a DAX character device such as /dev/dax0.0, or a file
// standing in for one) move bytes with a plain copy into or out of the
// shared mapping.
//
// The device is mapped MAP_SHARED, sized from Config, MC_CXL_DEV_SIZE,
// sysfs (/sys/bus/dax/devices/<dev>/size) or the file size. Buffers an
// engine registers inside the mapping are published with their device
// offset: the segment descriptor carries cxl_name, cxl_base_addr and, per
// buffer, "offset". A peer whose descriptor names the same cxl_name is
// reached through the device: a request's target address (the peer's
// virtual address, as for every transport) is translated to
// offset + (addr - buffer addr) and bounds-checked against the buffer and
// the device. A reference CXL segment, which addresses buffers by device
// offset only, is handled by treating the offset as the address.
//
// A WRITE is a copy followed by a full fence (MFENCE), so its completion
// is reported only after the stores are globally visible; a READ fences
// before copying. With Config.Flush the copied lines are also written back
// and invalidated (CLFLUSHOPT), for devices shared between hosts without
// hardware coherence. Copies complete inline, one cgo-free call per batch.
package cxl
