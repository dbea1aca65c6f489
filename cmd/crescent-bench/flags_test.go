package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// childEnv makes the test binary run main with the arguments after "--".
const childEnv = "CRESCENT_BENCH_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"crescent-bench"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Every refused command line is a usage error (exit 2) naming the flag,
// before anything runs.
func TestRefusedFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"frob"}, `unknown command "frob"`},
		{[]string{"transfer", "--threads", "0"}, "--threads 0"},
		{[]string{"transfer", "--batch_size", "0"}, "--batch_size 0"},
		{[]string{"transfer", "--batch_size", "-4"}, "--batch_size -4"},
		{[]string{"transfer", "--report_unit", "furlongs"}, `--report_unit "furlongs"`},
		{[]string{"transfer", "--duration", "0"}, "--duration 0"},
		{[]string{"transfer", "--duration", "-1"}, "--duration -1"},
		{[]string{"transfer", "--warmup", "-1"}, "--warmup -1"},
		{[]string{"transfer", "--block_size", "-1"}, `--block_size: size "-1": must be positive`},
		{[]string{"transfer", "--buffer_size", "lots"}, `--buffer_size: size "lots"`},
		{[]string{"transfer", "--lanes", "-1"}, "--lanes -1"},
		{[]string{"transfer", "--rdma_nics", "0"}, "--rdma_nics 0"},
		{[]string{"transfer", "--report_precision", "-1"}, "--report_precision -1"},
		{[]string{"transfer", "--mode", "sideways"}, `--mode "sideways"`},
		{[]string{"transfer", "--operation", "copy"}, `--operation "copy"`},
		{[]string{"transfer", "--mode", "initiator"}, "--segment_id"},
		{[]string{"transfer", "stray"}, `transfer: unexpected argument "stray"`},
		{[]string{"transfer", "--no_such_flag"}, "transfer: flag provided but not defined: -no_such_flag"},
		{[]string{"transfer", "--threads", "two"}, "-threads"},
		{[]string{"store", "--clients", "0"}, "--clients 0"},
		{[]string{"ha", "--ha_backend", "zk"}, `--ha_backend "zk"`},
		{[]string{"ha", "--masters", "1"}, "--masters 1"},
		{[]string{"ha", "--kills", "0"}, "--kills 0"},
		{[]string{"ha", "--lease_ttl_sec", "0"}, "--lease_ttl_sec 0"},
		{[]string{"ha", "--rate", "-1"}, "--rate -1"},
		{[]string{"ha", "--settle", "0"}, "--settle 0"},
		{[]string{"ha", "stray"}, `ha: unexpected argument "stray"`},
		{[]string{"store", "--threads", "0"}, "--threads 0"},
		{[]string{"store", "--replicas", "0"}, "--replicas 0"},
		{[]string{"store", "--objects", "0"}, "--objects 0"},
		{[]string{"store", "--batch", "-1"}, "--batch -1"},
		{[]string{"store", "--put_ahead", "-2"}, "--put_ahead -2"},
		{[]string{"store", "--location_cache", "-1"}, "--location_cache -1"},
		{[]string{"store", "--put_ahead_bytes", "0"}, `--put_ahead_bytes: size "0": must be positive`},
		{[]string{"store", "--put_ahead_bytes", "x"}, "--put_ahead_bytes: "},
		{[]string{"store", "--get_ratio", "1.5"}, "--get_ratio 1.5"},
		{[]string{"store", "--duration", "0"}, "--duration 0"},
		{[]string{"store", "--segment_size", "-1"}, `--segment_size: size "-1": must be positive`},
		{[]string{"store", "--value_size", "2GiB"}, "--value_size"},
		{[]string{"store", "--clients", "100"}, "--clients 100"}, // the bench's own bound
		{[]string{"store", "stray"}, `store: unexpected argument "stray"`},
		{[]string{"rpc", "--duration", "0"}, "--duration 0"},
		{[]string{"rpc", "--rounds", "-1"}, "--rounds -1"},
		{[]string{"rpc", "--inflight", "0"}, `--inflight "0"`},
		{[]string{"rpc", "--inflight", "1,x"}, `--inflight "1,x"`},
		{[]string{"rpc", "--layers", "carrier_pigeon"}, "carrier_pigeon"},
		{[]string{"rpc", "stray"}, `rpc: unexpected argument "stray"`},
		{[]string{"store", "--log_format", "xml"}, `store: --log_format "xml": want text or json`},
		{[]string{"transfer", "--log_level", "loud"}, `transfer: --log_level "loud"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			err := benchMain(context.Background(), tc.args)
			require.Error(t, err)
			assert.Equal(t, 2, exitCode(err), err.Error())
			assert.Contains(t, oneLine(err), tc.want)
			assert.NotContains(t, oneLine(err), "\n")
		})
	}
}

// Addresses that do not resolve or are not this host's name their flag
// (exit 1: the command line is well formed).
func TestAddressErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"transfer", "--local_server_name", "no-such-host.invalid"}, `--local_server_name "no-such-host.invalid": host "no-such-host.invalid" does not resolve`},
		{[]string{"transfer", "--local_server_name", "192.0.2.1"}, `--local_server_name "192.0.2.1": not an address of this host`},
		{[]string{"store", "--local_server_name", "192.0.2.1"}, `--local_server_name "192.0.2.1": not an address of this host`},
		{[]string{"store", "--master", "no-such-host.invalid:50051"}, `--master "no-such-host.invalid:50051": host "no-such-host.invalid" does not resolve`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			err := benchMain(context.Background(), tc.args)
			require.Error(t, err)
			assert.Equal(t, 1, exitCode(err))
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	err := benchMain(context.Background(), []string{"store", "--master", "nohost"})
	assert.Equal(t, 2, exitCode(err))
}

func TestExitCode(t *testing.T) {
	assert.Equal(t, 0, exitCode(nil))
	assert.Equal(t, 1, exitCode(errors.New("run failed")))
	assert.Equal(t, 2, exitCode(usagef("--x")))
}

// The built binary: exit codes 0 (-h, --version), 2 (usage, one line).
func TestMainExitCodes(t *testing.T) {
	run := func(args ...string) (int, string, string) {
		cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
		cmd.Env = append(os.Environ(), childEnv+"=1")
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), out.String(), errb.String()
		}
		require.NoError(t, err)
		return 0, out.String(), errb.String()
	}
	for _, args := range [][]string{{"-h"}, {"transfer", "-h"}, {"store", "-h"}, {"rpc", "-h"}} {
		code, _, stderr := run(args...)
		assert.Equal(t, 0, code, args)
		assert.Contains(t, stderr, "usage: crescent-bench", args)
	}
	code, out, _ := run("--version")
	assert.Equal(t, 0, code)
	assert.True(t, strings.HasPrefix(out, "crescent-bench "), out)
	code, _, stderr := run("transfer", "--threads", "0")
	assert.Equal(t, 2, code)
	assert.Equal(t, "crescent-bench: --threads 0: must be at least 1\n", stderr)
	code, _, stderr = run()
	assert.Equal(t, 2, code)
	assert.Equal(t, 1, strings.Count(stderr, "\n"), stderr)
}
