package bench

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Client processes get their share of the CPUs unless the caller chose.
func TestChildEnvGOMAXPROCS(t *testing.T) {
	for _, tc := range []struct {
		name         string
		base, extra  []string
		clients, cpu int
		want         []string
	}{
		{"share", []string{"A=1"}, nil, 2, 2, []string{"A=1", "GOMAXPROCS=1"}},
		{"more-cpus", nil, []string{"B=2"}, 2, 8, []string{"B=2", "GOMAXPROCS=4"}},
		{"at-least-one", nil, nil, 4, 2, []string{"GOMAXPROCS=1"}},
		{"zero-clients", nil, nil, 0, 2, []string{"GOMAXPROCS=2"}},
		{"caller-env", []string{"GOMAXPROCS=3"}, nil, 2, 2, []string{"GOMAXPROCS=3"}},
		{"empty-is-unset", []string{"GOMAXPROCS="}, nil, 2, 2, []string{"GOMAXPROCS=", "GOMAXPROCS=1"}},
		{"caller-extra", nil, []string{"GOMAXPROCS=2"}, 2, 2, []string{"GOMAXPROCS=2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, childEnv(tc.base, tc.extra, tc.clients, tc.cpu))
		})
	}
}
