package engine

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// detectLocation names the NUMA node of mem's first page ("cpu:N"), as the
// reference does for location "*". It falls back to cpu:0.
func detectLocation(mem []byte) string {
	if len(mem) == 0 {
		return "cpu:0"
	}
	page := uintptr(unsafe.Pointer(unsafe.SliceData(mem))) &^ uintptr(unix.Getpagesize()-1)
	var status int32 = -1
	// move_pages with nodes == NULL only reports where each page lives.
	_, _, errno := unix.Syscall6(unix.SYS_MOVE_PAGES, 0, 1, uintptr(unsafe.Pointer(&page)), 0, uintptr(unsafe.Pointer(&status)), 0)
	if errno != 0 || status < 0 {
		return "cpu:0"
	}
	return fmt.Sprintf("cpu:%d", status)
}
