package master

import (
	"errors"
	"testing"
	"time"

	"github.com/crescent-kv/crescent/store/errcode"
)

// FuzzInput feeds arbitrary keys, sizes and configs to every entry point
// that takes them: each call must either succeed or fail with a store
// error code, never panic, and leave the invariants intact.
func FuzzInput(f *testing.F) {
	f.Add("key", uint64(100), uint32(1), true, uint64(1000), false, "seg", "k.*")
	f.Add("", uint64(0), uint32(0), false, uint64(0), true, "", "(")
	f.Add("\xff\xfe", ^uint64(0), ^uint32(0), true, ^uint64(0), true, "a", "[a-")
	f.Add("model/layer/block-00000001", uint64(1<<20), uint32(17), false, uint64(1), false, "a", ".*")
	f.Fuzz(func(t *testing.T, key string, size uint64, replicas uint32, soft bool, ttlMs uint64, hard bool, pref, re string) {
		e := newEnv(t, nil)
		e.mount(cl(1), "a", 4<<20)
		e.mount(cl(2), "seg", 4<<20)
		var rc ReplicateConfig // what a request without a config decodes to
		var err error
		rc.Replicas = int(replicas % 40)
		rc.SoftPin, rc.HardPin = soft, hard
		rc.SoftPinTTL = time.Duration(min(ttlMs, 1<<40)) * time.Millisecond
		rc.Preferred = []string{pref}
		isStore := func(err error) {
			t.Helper()
			var se *errcode.Error
			if err != nil && !errors.As(err, &se) {
				t.Fatalf("not a store error: %v", err)
			}
		}
		_, err = e.m.PutStart(cl(1), key, size, rc)
		isStore(err)
		isStore(e.m.PutEnd(cl(1), key, Memory, nil))
		_, _, err = e.m.GetReplicaList(key)
		isStore(err)
		_, err = e.m.ExistKey(key, soft)
		isStore(err)
		_, err = e.m.QueryKey(key)
		isStore(err)
		res, err := e.m.BatchPutStart(cl(2), []string{key, key + "x"}, []uint64{size, size / 2}, rc)
		isStore(err)
		for _, r := range res {
			isStore(r.Err)
		}
		_, err = e.m.RemoveByRegex(re, hard)
		isStore(err)
		isStore(e.m.Remove(key, hard))
		checkInvariants(t, e.m)
	})
}
