package bench

import (
	"errors"
	"fmt"
	"strings"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/transport/rdma/soft"
	"github.com/crescent-kv/crescent/internal/verbs"
)

// SoftRDMA is the RDMADevice value selecting the software RDMA device.
const SoftRDMA = "soft"

// DeviceCalls counts calls through the RDMA device interface during the
// measured rounds, per batch. With libibverbs each call is one cgo
// crossing; on the software device they are Go calls counted at the same
// boundary.
type DeviceCalls struct {
	Device       string  `json:"device"` // "soft" or "verbs"
	PerBatch     float64 `json:"per_batch"`
	Post         float64 `json:"post_per_batch"`
	Poll         float64 `json:"poll_per_batch"`
	Arm          float64 `json:"arm_per_batch"`
	Wait         float64 `json:"wait_per_batch"`
	WorkRequests float64 `json:"work_requests_per_batch,omitempty"`
}

// rdmaSetup holds the software NICs of a loopback rdma run.
type rdmaSetup struct {
	fabric *soft.Fabric
	devs   []*soft.Device
}

func (c *TransferConfig) checkRDMA() error {
	if c.Protocol != "rdma" || c.RDMADevice != SoftRDMA {
		return nil
	}
	if c.Mode != "loopback" {
		return errors.New("bench: --rdma_device soft works in loopback mode only (both sides in this process)")
	}
	if c.RDMANICs <= 0 {
		c.RDMANICs = 2
	}
	if c.rdma == nil {
		c.rdma = &rdmaSetup{fabric: soft.NewFabric()}
	}
	return nil
}

// rdmaConfig sets the rdma transport's devices: new software NICs for
// this side, or the named hardware NICs.
func (c *TransferConfig) rdmaConfig(ec *engine.Config) {
	switch {
	case c.Protocol != "rdma":
	case c.RDMADevice == SoftRDMA:
		for i := range c.RDMANICs {
			d := c.rdma.fabric.NewDevice(fmt.Sprintf("soft%d", i), soft.Options{})
			c.rdma.devs = append(c.rdma.devs, d)
			ec.RDMA.Devices = append(ec.RDMA.Devices, d)
		}
	case c.RDMADevice != "":
		ec.RDMA.DeviceNames = strings.Split(c.RDMADevice, ",")
	}
}

// closeRDMA closes the software NICs, after the engines.
func (c *TransferConfig) closeRDMA() {
	if c.rdma == nil {
		return
	}
	for _, d := range c.rdma.devs {
		d.Close()
	}
	c.rdma.devs = nil
}

// callSnapshot reads the device-call counters.
type callSnapshot struct {
	post, poll, arm, wait, wrs uint64
}

func (c *TransferConfig) deviceCalls() (callSnapshot, string) {
	if c.Protocol != "rdma" {
		return callSnapshot{}, ""
	}
	if c.rdma != nil {
		var s soft.Stats
		for _, d := range c.rdma.devs {
			s = s.Add(d.Stats())
		}
		return callSnapshot{post: s.PostCalls, poll: s.PollCalls, arm: s.ArmCalls, wait: s.WaitCalls, wrs: s.PostedWRs}, SoftRDMA
	}
	v := verbs.Crossings()
	return callSnapshot{post: v.Post, poll: v.Poll, arm: v.Arm, wait: v.Event}, "verbs"
}

func perBatch(before, after callSnapshot, dev string, batches int64) *DeviceCalls {
	if dev == "" || batches == 0 {
		return nil
	}
	b := float64(batches)
	d := &DeviceCalls{Device: dev,
		Post: float64(after.post-before.post) / b, Poll: float64(after.poll-before.poll) / b,
		Arm: float64(after.arm-before.arm) / b, Wait: float64(after.wait-before.wait) / b,
		WorkRequests: float64(after.wrs-before.wrs) / b}
	d.PerBatch = d.Post + d.Poll + d.Arm + d.Wait
	return d
}
