package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"tagged", debug.BuildInfo{GoVersion: "go1.24.4", Main: debug.Module{Version: "v1.2.3"}}, "x v1.2.3 go1.24.4"},
		{"checkout", debug.BuildInfo{GoVersion: "go1.24.4", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "1f3c2a9d0b7e55aa"}, {Key: "vcs.modified", Value: "true"}}}, "x (devel) rev 1f3c2a9d0b7e (modified) go1.24.4"},
		{"clean", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "false"}}}, "x (devel) rev abc"},
		{"empty", debug.BuildInfo{}, "x (devel)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, fromBuildInfo(&tc.bi).String("x"))
		})
	}
}

func TestLine(t *testing.T) {
	l := Line("crescent-test")
	require.True(t, strings.HasPrefix(l, "crescent-test "), l)
	assert.NotContains(t, l, "\n")
}
