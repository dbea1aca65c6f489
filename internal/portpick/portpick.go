package portpick

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// span is how many ports below the ephemeral range picks come from.
const span = 12000

var (
	mu     sync.Mutex
	handed = map[int]bool{}
)

// Port returns a TCP port that nothing on the host had bound a moment ago
// and that this process has not returned before.
func Port() (int, error) {
	lo, hi := window()
	mu.Lock()
	defer mu.Unlock()
	if hi <= lo { // no room below the ephemeral range: the kernel picks
		for range 100 {
			p, err := kernelPort()
			if err != nil {
				return 0, err
			}
			if !handed[p] {
				handed[p] = true
				return p, nil
			}
		}
		return 0, errors.New("portpick: the kernel keeps returning ports already handed out")
	}
	// From a random start, every port of the window once.
	var lastErr error
	start := rand.IntN(hi - lo)
	for i := range hi - lo {
		p := lo + (start+i)%(hi-lo)
		if handed[p] {
			continue
		}
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p)) // every address, both families
		if err != nil {
			lastErr = err
			continue
		}
		l.Close()
		handed[p] = true
		return p, nil
	}
	if lastErr == nil {
		lastErr = errors.New("all handed out")
	}
	return 0, fmt.Errorf("portpick: no free port in [%d, %d): %w", lo, hi, lastErr)
}

// Ports returns n distinct ports (see Port).
func Ports(n int) ([]int, error) {
	ps := make([]int, n)
	for i := range ps {
		p, err := Port()
		if err != nil {
			return nil, err
		}
		ps[i] = p
	}
	return ps, nil
}

// window is [lo, hi): the span ports below the kernel's ephemeral range,
// not below 1024.
func window() (lo, hi int) {
	hi = 32768 // Linux's default start of the range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				hi = v
			}
		}
	}
	return max(1024, hi-span), hi
}

func kernelPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
