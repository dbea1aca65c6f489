package buildinfo

import (
	"runtime/debug"
	"strings"
)

// Info is what the Go toolchain recorded about a build.
type Info struct {
	Version   string // main module version; "(devel)" from a checkout, "unknown" without build info
	Revision  string // vcs.revision, "" when not recorded
	Modified  bool   // vcs.modified
	GoVersion string
}

// Read returns the running binary's Info.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "unknown"}
	}
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) Info {
	in := Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if in.Version == "" {
		in.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	return in
}

// String formats the version line of the package doc for name.
func (in Info) String(name string) string {
	var b strings.Builder
	b.WriteString(name)
	b.WriteByte(' ')
	b.WriteString(in.Version)
	if in.Revision != "" {
		rev := in.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		b.WriteString(" rev ")
		b.WriteString(rev)
		if in.Modified {
			b.WriteString(" (modified)")
		}
	}
	if in.GoVersion != "" {
		b.WriteByte(' ')
		b.WriteString(in.GoVersion)
	}
	return b.String()
}

// Line is Read().String(name): what --version prints.
func Line(name string) string { return Read().String(name) }
