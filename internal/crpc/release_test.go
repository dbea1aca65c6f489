package crpc

import (
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestReleaseYieldsToNextReader: a caller that hands the read role to a
// waiting caller lets that caller run before it goes on (on one P, the
// waiter would otherwise wait until the releaser blocks, its next request
// already sent). Under -race the scheduler sometimes queues the woken
// goroutine behind another, so a majority of tries must see it run.
func TestReleaseYieldsToNextReader(t *testing.T) {
	ran, tries := releaseRuns(false)
	assert.GreaterOrEqual(t, ran, tries/2+1, "the waiter ran before the releaser went on in %d of %d tries", ran, tries)
}

// TestReleaseNoYieldWithPollWait: callers that poll-wait sit on locked
// threads, where a yield switches threads twice; they do not yield.
func TestReleaseNoYieldWithPollWait(t *testing.T) {
	ran, tries := releaseRuns(true)
	assert.Less(t, ran, tries/2+1, "the waiter ran before the releaser went on in %d of %d tries", ran, tries)
}

// releaseRuns counts the tries, on one P, in which a caller waiting for
// the read role ran before release returned.
func releaseRuns(noYield bool) (ran, tries int) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	tries = 7
	for range tries {
		cc := &clientConn{role: make(chan struct{}, 1), noYield: noYield}
		cc.waiting.Add(1) // the waiter below, as claim counts it
		var took atomic.Bool
		done := make(chan struct{})
		go func() {
			<-cc.role
			took.Store(true)
			close(done)
		}()
		runtime.Gosched() // let the waiter block on the role
		cc.release()
		if took.Load() {
			ran++
		}
		<-done
	}
	return ran, tries
}

// TestReleaseReturnsTheToken: with nobody waiting the role's token goes
// back for the next caller or the background reader.
func TestReleaseReturnsTheToken(t *testing.T) {
	cc := &clientConn{role: make(chan struct{}, 1)}
	cc.release()
	select {
	case <-cc.role:
	default:
		t.Fatal("release did not put the role token back")
	}
}
