package service

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/crescent-kv/crescent/store/storepb"
)

// Every RPC of the service is counted by the one interceptor: a method
// missing from rpcOf would be served but never show in the metrics.
func TestEveryRPCCounted(t *testing.T) {
	seen := map[int]bool{}
	for _, m := range storepb.Master_ServiceDesc.Methods {
		name := "/" + storepb.Master_ServiceDesc.ServiceName + "/" + m.MethodName
		rpc, ok := rpcOf[name]
		if assert.True(t, ok, "%s has no counter", name) {
			assert.False(t, seen[int(rpc)], "%s shares a counter", name)
			seen[int(rpc)] = true
			assert.NotEmpty(t, rpcNames[rpc], "%s has no metric name", name)
		}
	}
	assert.Len(t, seen, int(numRPC))
}
