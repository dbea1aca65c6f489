package mempool

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeHost points Available at files in a temp dir: MemAvailable of
// availKB and /proc/self/cgroup with cgroupLines; it returns the fake
// cgroup root.
func fakeHost(t *testing.T, availKB int64, cgroupLines string) string {
	t.Helper()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "meminfo"), fmt.Sprintf("MemTotal:       99999999 kB\nMemFree:  1 kB\nMemAvailable:   %d kB\n", availKB))
	write(t, filepath.Join(dir, "cgroup"), cgroupLines)
	root := filepath.Join(dir, "sys")
	oldM, oldC, oldR := meminfoPath, cgroupFile, cgroupRoot
	meminfoPath, cgroupFile, cgroupRoot = filepath.Join(dir, "meminfo"), filepath.Join(dir, "cgroup"), root
	t.Cleanup(func() { meminfoPath, cgroupFile, cgroupRoot = oldM, oldC, oldR })
	return root
}

func write(t *testing.T, name, data string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(name), 0o755))
	require.NoError(t, os.WriteFile(name, []byte(data), 0o644))
}

// A pool larger than this host's MemAvailable is refused before any
// memory is touched. NoPrefault keeps a regression of the check from
// faulting in more than the host has: New would then just succeed.
func TestNewRefusesMoreThanAvailable(t *testing.T) {
	m, err := Available()
	require.NoError(t, err)
	size := m.Bytes + 1<<30
	fds := openFds(t)
	p, err := New(Options{Size: size, NoPrefault: true})
	if err == nil {
		p.Close()
	}
	require.ErrorIs(t, err, ErrNotEnoughMemory)
	assert.Contains(t, err.Error(), fmt.Sprintf("%d bytes", roundUp(size, DefaultSlabSize)))
	assert.Contains(t, err.Error(), "MemAvailable")
	assert.Contains(t, err.Error(), "AllowOvercommit")
	assert.Equal(t, fds, openFds(t), "no memfd was created")
}

func TestNewChecksInjectedLimits(t *testing.T) {
	const size = 128 << 20
	fakeHost(t, 64<<10, "0::/\n") // 64 MiB available, no cgroup limit
	_, err := New(Options{Size: size, SlabSize: 1 << 20})
	require.ErrorIs(t, err, ErrNotEnoughMemory)
	assert.Contains(t, err.Error(), "pool of 128 MiB (134217728 bytes) is more than the 64 MiB available")

	// The override creates it (128 MiB really exist here).
	p := newPool(t, Options{Size: size, SlabSize: 1 << 20, AllowOvercommit: true, NoPrefault: true})
	assert.Equal(t, int64(size), p.Size())

	// Within the limit nothing changes.
	newPool(t, Options{Size: 32 << 20, SlabSize: 1 << 20})
}

func TestAvailableCgroupV2(t *testing.T) {
	root := fakeHost(t, 16<<20, "0::/a/b\n") // 16 GiB available
	write(t, filepath.Join(root, "a/b/memory.max"), "max\n")
	write(t, filepath.Join(root, "a/b/memory.current"), "1000\n")
	write(t, filepath.Join(root, "a/memory.max"), fmt.Sprint(1<<30))
	write(t, filepath.Join(root, "a/memory.current"), fmt.Sprint(512<<20))
	write(t, filepath.Join(root, "a/memory.stat"), fmt.Sprintf("anon 1\ninactive_file %d\nactive_file 9\n", 128<<20))
	m, err := Available()
	require.NoError(t, err)
	assert.Equal(t, int64(640<<20), m.Bytes, "memory.max of the parent minus its working set")
	assert.Contains(t, m.From, filepath.Join(root, "a")+": memory.max 1 GiB, 384 MiB in use")
	assert.Contains(t, m.From, "MemAvailable 16 GiB")

	_, err = New(Options{Size: 1 << 30, NoPrefault: true})
	require.ErrorIs(t, err, ErrNotEnoughMemory)
	assert.Contains(t, err.Error(), "640 MiB available")
}

func TestAvailableCgroupV1(t *testing.T) {
	root := fakeHost(t, 16<<20, "5:devices:/\n4:cpuacct,memory:/x\n0::/\n")
	write(t, filepath.Join(root, "memory/x/memory.limit_in_bytes"), fmt.Sprint(256<<20))
	write(t, filepath.Join(root, "memory/x/memory.usage_in_bytes"), "0")
	write(t, filepath.Join(root, "memory/memory.limit_in_bytes"), "9223372036854771712")
	write(t, filepath.Join(root, "memory/memory.usage_in_bytes"), "5")
	m, err := Available()
	require.NoError(t, err)
	assert.Equal(t, int64(256<<20), m.Bytes)
	assert.Contains(t, m.From, "memory.limit_in_bytes 256 MiB")

	// MemAvailable binds when it is the smaller.
	fakeHost(t, 1<<10, "4:memory:/\n")
	m, err = Available()
	require.NoError(t, err)
	assert.Equal(t, int64(1<<20), m.Bytes)
}

func TestAvailableWithoutMeminfo(t *testing.T) {
	fakeHost(t, 0, "")
	require.NoError(t, os.WriteFile(meminfoPath, []byte("MemTotal: 1 kB\n"), 0o644))
	_, err := New(Options{Size: 1 << 20, SlabSize: 1 << 20})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no MemAvailable")
	newPool(t, Options{Size: 1 << 20, SlabSize: 1 << 20, AllowOvercommit: true})
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1 << 10: "1 KiB", 3 << 19: "1.5 MiB", 64 << 30: "64 GiB", 20<<30 + 1<<29: "20.5 GiB"} {
		assert.Equal(t, want, FormatSize(n))
	}
}
