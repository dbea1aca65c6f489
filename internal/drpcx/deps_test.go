package drpcx

import (
	"testing"

	"github.com/crescent-kv/crescent/internal/depcheck"
)

// TestOnlyTheBenchLinksDRPC: drpc stays in this package and the bench, so
// dropping it is deleting them; the store, the master and the daemons
// never link it.
func TestOnlyTheBenchLinksDRPC(t *testing.T) {
	for _, pkg := range []string{"../../store", "../../store/master/service", "../../cmd/crescent-master", "../../cmd/crescent-client"} {
		depcheck.Forbid(t, pkg, []string{"storj.io/drpc", "github.com/crescent-kv/crescent/internal/drpcx"})
	}
}
