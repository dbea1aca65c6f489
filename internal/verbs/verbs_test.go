package verbs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/engine/transport/rdma/rdmadev"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func gid(s string) rdmadev.GID {
	g, err := rdmadev.ParseGID(s)
	if err != nil {
		panic(err)
	}
	return g
}

func TestChooseGID(t *testing.T) {
	linkLocal := gid("fe80::21b:21ff:fe38:a1b2")
	v4 := gid("::ffff:10.1.2.3")
	v6 := gid("2001:db8::5")
	for _, tc := range []struct {
		name    string
		ll      rdmadev.LinkLayer
		entries []GIDEntry
		want    int
	}{
		{"ib first", rdmadev.LinkInfiniBand, []GIDEntry{{0, linkLocal, "IB/RoCE v1"}, {1, v4, "RoCE v2"}}, 0},
		{"roce v2 ipv4 first", rdmadev.LinkEthernet, []GIDEntry{{0, linkLocal, "IB/RoCE v1"}, {1, linkLocal, "RoCE v2"}, {2, v4, "IB/RoCE v1"}, {3, v4, "RoCE v2"}}, 3},
		{"roce v2 without ipv4", rdmadev.LinkEthernet, []GIDEntry{{0, linkLocal, "IB/RoCE v1"}, {1, v6, "RoCE v2"}}, 1},
		{"no types known", rdmadev.LinkEthernet, []GIDEntry{{0, rdmadev.GID{}, ""}, {1, v4, ""}}, 1},
		{"empty table", rdmadev.LinkEthernet, []GIDEntry{{0, rdmadev.GID{}, "RoCE v2"}}, -1},
		{"nothing", rdmadev.LinkInfiniBand, nil, -1},
	} {
		if got := ChooseGID(tc.ll, tc.entries); got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestSysfs(t *testing.T) {
	root := t.TempDir()
	write := func(rel, s string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("class/infiniband/mlx5_0/device/numa_node", "1\n")
	write("class/infiniband/mlx5_1/device/numa_node", "-1\n")
	write("class/infiniband/mlx5_2/device/numa_node", "junk\n")
	write("class/infiniband/mlx5_0/ports/1/gid_attrs/types/3", "RoCE v2\n")
	for dev, want := range map[string]int{"mlx5_0": 1, "mlx5_1": -1, "mlx5_2": -1, "mlx5_9": -1} {
		if got := NUMANode(root, dev); got != want {
			t.Errorf("NUMANode(%s) = %d, want %d", dev, got, want)
		}
	}
	if got := gidType(root, "mlx5_0", 1, 3); got != "RoCE v2" {
		t.Errorf("gidType = %q", got)
	}
	if got := gidType(root, "mlx5_0", 1, 4); got != "" {
		t.Errorf("gidType of a missing entry = %q", got)
	}
}

func TestHelpers(t *testing.T) {
	if wcOpcode(1) != rdmadev.OpWrite || wcOpcode(2) != rdmadev.OpRead || wcOpcode(0) == rdmadev.OpWrite {
		t.Fatal("wcOpcode")
	}
	if clampAtomic(16, 8) != 8 || clampAtomic(16, 0) != 16 || clampAtomic(4, 16) != 4 {
		t.Fatal("clampAtomic")
	}
	if !errors.Is(ErrNoDevices, rdmadev.ErrNotSupported) || !errors.Is(ErrUnavailable, rdmadev.ErrNotSupported) {
		t.Fatal("errors do not match rdmadev.ErrNotSupported")
	}
	c := Counts{Post: 1, Poll: 2, Arm: 3, Event: 4, Control: 5}
	if c.Total() != 15 {
		t.Fatal("Total")
	}
}

// TestLoadMissingLibrary: a library name that does not resolve fails
// cleanly, as "not available" (in every build).
func TestLoadMissingLibrary(t *testing.T) {
	l, err := Load("libibverbs-not-here.so.9")
	if err == nil {
		l.Close()
		t.Fatal("loaded a missing library")
	}
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, rdmadev.ErrNotSupported) {
		t.Fatalf("err = %v", err)
	}
	t.Log(err)
}
