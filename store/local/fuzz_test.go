package local

import (
	"testing"

	"github.com/crescent-kv/crescent/store"
)

type storeReplicateConfig = store.ReplicateConfig

// FuzzDecode: no body a peer sends makes a decoder panic or allocate
// past the bounds.
func FuzzDecode(f *testing.F) {
	e := newEnc(opBatchPut, 1, token{})
	e.u32(1)
	e.str("k")
	e.u8(refNone)
	e.bytes([]byte("v"))
	encRC(e, storeRC())
	f.Add(e.frame(stOK))
	f.Add(make([]byte, hdrLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= hdrLen {
			parseHeader(b[:hdrLen])
			b = b[hdrLen:]
		}
		d := dec{b: b}
		n := d.count()
		for range n {
			d.str()
			switch d.u8() {
			case refNone:
				d.blob(MaxInline, "value")
			case refRegion:
				d.u32()
				d.u64()
				d.u64()
			}
		}
		decRC(&d)
		d.itemErr()
		d.errReply()
		decKeys(&d)
		d.done()
	})
}

func storeRC() (rc storeReplicateConfig) {
	rc.Replicas, rc.Preferred = 2, []string{"a:1"}
	return rc
}
