package mempool

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrNotEnoughMemory: the pool is larger than the memory the host (or the
// process's cgroup) has available. Prefaulting it would end in the kernel
// OOM killer, which may take other processes with it.
var ErrNotEnoughMemory = errors.New("mempool: not enough memory available")

// Where the memory figures come from; tests point them at files they
// write.
var (
	meminfoPath = "/proc/meminfo"
	cgroupFile  = "/proc/self/cgroup"
	cgroupRoot  = "/sys/fs/cgroup"
)

// unlimited is what cgroup v1 reports for no limit (rounded down to a
// page); anything this large is no limit.
const unlimited = 1 << 62

// Memory is what a new pool can take without the OOM killer.
type Memory struct {
	// Bytes is the smaller of MemAvailable and the cgroup's room.
	Bytes int64
	// From says where Bytes came from and what the other limits were,
	// for error messages ("MemAvailable 20.1 GiB (/proc/meminfo); cgroup
	// /sys/fs/cgroup/x: memory.max 8 GiB, 2 GiB in use").
	From string
}

// Available reads MemAvailable from /proc/meminfo and the limit and usage
// of the process's memory cgroup (v2 memory.max minus memory.current,
// walking up to the root; v1 memory.limit_in_bytes minus
// memory.usage_in_bytes), counting inactive page cache as free since the
// kernel reclaims it before it OOM-kills.
func Available() (Memory, error) {
	avail, err := memAvailable()
	if err != nil {
		return Memory{}, err
	}
	m := Memory{Bytes: avail, From: fmt.Sprintf("MemAvailable %s (%s)", FormatSize(avail), meminfoPath)}
	if room, desc, ok := cgroupRoom(); ok {
		m.From += "; " + desc
		if room < m.Bytes {
			m.Bytes = room
		}
	}
	return m, nil
}

// CheckAvailable returns an error wrapping ErrNotEnoughMemory when size
// bytes are more than Available, naming both. what names the request in
// the message ("pool", "--global_segment_size 64 GB").
func CheckAvailable(what string, size int64) error {
	m, err := Available()
	if err != nil {
		return fmt.Errorf("mempool: cannot tell whether %s of %s fits in memory: %w", what, FormatSize(size), err)
	}
	if size > m.Bytes {
		return fmt.Errorf("%w: %s of %s (%d bytes) is more than the %s available: %s",
			ErrNotEnoughMemory, what, FormatSize(size), size, FormatSize(max(m.Bytes, 0)), m.From)
	}
	return nil
}

func memAvailable() (int64, error) {
	f, err := os.Open(meminfoPath)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: MemAvailable %q: %w", meminfoPath, rest, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: no MemAvailable line (kernel older than 3.14?)", meminfoPath)
}

// cgroupRoom is the memory the process's cgroup can still take: the
// least room over the cgroup and its ancestors. ok is false without a
// memory limit.
func cgroupRoom() (room int64, desc string, ok bool) {
	data, err := os.ReadFile(cgroupFile)
	if err != nil {
		return 0, "", false
	}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			if r, d, ok := cgroupV2(parts[2]); ok {
				return r, d, true
			}
		case hasController(parts[1], "memory"):
			if r, d, ok := cgroupV1(parts[2]); ok {
				return r, d, true
			}
		}
	}
	return 0, "", false
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// cgroupV2 and cgroupV1 walk from the process's cgroup up to the root of
// the mounted hierarchy and take the least room: an ancestor's limit
// binds too. (Inside a cgroup namespace the path is "/" and the root's
// files are the container's.)
func cgroupV2(path string) (int64, string, bool) {
	return walkCgroup(cgroupRoot, path, "memory.max", "memory.current", "inactive_file")
}

func cgroupV1(path string) (int64, string, bool) {
	return walkCgroup(filepath.Join(cgroupRoot, "memory"), path,
		"memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
}

func walkCgroup(root, path, limitFile, usageFile, inactive string) (room int64, desc string, ok bool) {
	for dir := filepath.Join(root, path); ; dir = filepath.Dir(dir) {
		limit, err1 := readCgroupInt(filepath.Join(dir, limitFile))
		used, err2 := readCgroupInt(filepath.Join(dir, usageFile))
		if err1 == nil && err2 == nil && limit < unlimited {
			used = max(used-statField(filepath.Join(dir, "memory.stat"), inactive), 0)
			if r := limit - used; !ok || r < room {
				room, ok = r, true
				desc = fmt.Sprintf("cgroup %s: %s %s, %s in use", dir, limitFile, FormatSize(limit), FormatSize(used))
			}
		}
		if dir == root || !strings.HasPrefix(dir, root+"/") {
			return room, desc, ok
		}
	}
}

// readCgroupInt reads a one-number cgroup file; "max" is no limit.
func readCgroupInt(name string) (int64, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return unlimited, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return int64(min(v, unlimited)), nil
}

// statField is one "name value" line of a memory.stat file, 0 if absent.
func statField(name, field string) int64 {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+" "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// FormatSize writes n bytes with a binary unit ("64 GiB", "1.5 MiB").
func FormatSize(n int64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/1024, 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return strings.TrimSuffix(strings.TrimSuffix(fmt.Sprintf("%.1f", v), "0"), ".") + " " + units[i:i+1] + "iB"
}
