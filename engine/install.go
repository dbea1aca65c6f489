package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/crescent-kv/crescent/engine/transport"
)

// defaultProtocols is Config.Protocols' default order; it ranks a
// transport installed at run time that Config.Protocols does not name.
var defaultProtocols = []string{"shm", "cxl", "rdma", "efa", "tcp"}

// transportsNow is the running transports, in order of preference. The
// slice is never modified: Install/UninstallTransport replace it.
func (e *Engine) transportsNow() []transport.Transport {
	if p := e.tlist.Load(); p != nil {
		return *p
	}
	return nil
}

// rank orders transports: Config.Protocols first, in its order, then the
// others in the default order.
func (e *Engine) rank(name string) int {
	if i := slices.Index(e.cfg.Protocols, name); i >= 0 {
		return i
	}
	return len(e.cfg.Protocols) + slices.Index(defaultProtocols, name)
}

// InstallTransport starts the transport proto ("tcp", "shm", "cxl",
// "rdma", "efa") on a running engine, as New would have (its Config
// section, the engine's token and admission), registers the buffers
// registered so far with it, and publishes the descriptor with it, so
// peers that fetch it again reach this engine over it. It takes its
// place in Config.Protocols' order (one not named there comes after
// them, in the default order). Installing a
// running transport does nothing (as the reference returns the one it
// has). An unknown name is ErrInvalidConfig; one that cannot start here
// wraps the transport's error (transport.ErrNotSupported when the host
// lacks the device or library).
func (e *Engine) InstallTransport(ctx context.Context, proto string) error {
	if !slices.Contains(defaultProtocols, proto) {
		return fmt.Errorf("%w: unknown protocol %q (want one of %v)", ErrInvalidConfig, proto, defaultProtocols)
	}
	e.trMu.Lock()
	defer e.trMu.Unlock()
	if e.closed.Load() {
		return ErrClosed
	}
	cur := e.transportsNow()
	if slices.ContainsFunc(cur, func(t transport.Transport) bool { return t.Name() == proto }) {
		return nil
	}
	t, err := newTransport(proto, &e.cfg)
	if err != nil {
		return err
	}
	if wrapTransport != nil {
		t = wrapTransport(t)
	}
	if err := t.Start(e.env); err != nil {
		t.Close()
		return fmt.Errorf("engine: install %s: %w", proto, err)
	}
	if rt, ok := t.(transport.Registerer); ok {
		regs := e.reg.Regions()
		for i, r := range regs {
			if err := rt.AfterRegister(r); err != nil {
				e.withdrawAll(ctx, t, regs[:i])
				t.Close()
				return fmt.Errorf("engine: install %s: register [%#x,+%d): %w", proto, r.Addr, r.Len(), err)
			}
		}
	}
	next := append(slices.Clone(cur), t)
	sort.SliceStable(next, func(i, j int) bool { return e.rank(next[i].Name()) < e.rank(next[j].Name()) })
	e.tlist.Store(&next)
	if e.closed.Load() { // Close ran meanwhile and may have missed it
		t.Close()
		return ErrClosed
	}
	e.log.Info("transport installed", "protocol", proto, "transports", names(next))
	e.dropDesc()
	return e.publish()
}

// UninstallTransport stops the running transport proto: the descriptor
// is published without it first (peers that fetch it again stop
// choosing it), then every registered buffer is withdrawn from it (for
// shm: same-host peers unmap them) and it closes its listener and
// connections. Requests it still carried end FAILED with an error
// wrapping ErrTransportUninstalled that names it; later requests that
// only it could carry are refused with ErrNoTransport, also wrapping
// ErrTransportUninstalled. A buffer a same-host peer did not confirm it
// unmapped stays pinned (UnregisterMemory answers ErrUnregisterBusy)
// until that peer's connection is gone. InstallTransport starts it
// again. Not running: ErrTransportUninstalled.
func (e *Engine) UninstallTransport(ctx context.Context, proto string) error {
	e.trMu.Lock()
	defer e.trMu.Unlock()
	if e.closed.Load() {
		return ErrClosed
	}
	cur := e.transportsNow()
	i := slices.IndexFunc(cur, func(t transport.Transport) bool { return t.Name() == proto })
	if i < 0 {
		return fmt.Errorf("%w: %q is not running (running: %v)", ErrTransportUninstalled, proto, names(cur))
	}
	t := cur[i]
	next := slices.Delete(slices.Clone(cur), i, i+1)
	e.uninstalled.Store(t, proto)
	e.tlist.Store(&next)
	if e.removed == nil {
		e.removed = make(map[string]bool)
	}
	e.removed[proto] = true
	e.dropDesc()
	perr := e.publish()
	e.withdrawAll(ctx, t, e.reg.Regions())
	err := t.Close()
	e.log.Info("transport uninstalled", "protocol", proto, "transports", names(next))
	return errors.Join(perr, err)
}

// withdrawAll withdraws regs from t (before t stops: same-host peers
// unmap them, NICs deregister them). A region a peer did not confirm it
// unmapped is pinned until the peer's connection is gone, so its memory
// is not reused under the peer's copies.
func (e *Engine) withdrawAll(ctx context.Context, t transport.Transport, regs []*transport.Region) {
	u, ok := t.(transport.Unregisterer)
	if !ok {
		return
	}
	for _, r := range regs {
		err := u.BeforeUnregister(ctx, r.Addr, r.Len())
		var ue *transport.UnconfirmedError
		switch {
		case errors.As(err, &ue):
			e.log.Warn("uninstall: a peer did not confirm it unmapped a buffer; it stays pinned until that peer is gone",
				"protocol", t.Name(), "addr", r.Addr, "len", r.Len(), "err", err)
			hold, herr := e.reg.Acquire(r.Addr, r.Len())
			if herr != nil {
				continue
			}
			released := ue.Released
			if !e.bg.Go(func() {
				for _, ch := range released {
					select {
					case <-ch:
					case <-e.watchCtx.Done():
					}
				}
				hold.Release()
			}) {
				hold.Release()
			}
		case err != nil:
			e.log.Warn("uninstall: withdraw a buffer", "protocol", t.Name(), "addr", r.Addr, "err", err)
		}
	}
}

// uninstalledErr names the uninstalled transport that failed a request,
// or returns err unchanged.
func (e *Engine) uninstalledErr(via transport.Transport, err error) error {
	if via == nil {
		return err
	}
	if name, ok := e.uninstalled.Load(via); ok {
		return fmt.Errorf("%w: %s was uninstalled while the request ran: %w", ErrTransportUninstalled, name, err)
	}
	return err
}

// noTransport is routeRequest's refusal when none of tried (the
// transports running then) accepts a target: it names the protocols of
// both ends, and wraps ErrTransportUninstalled when the peer offers one
// missing from tried because it was uninstalled here.
func (e *Engine) noTransport(s *segment, tried []transport.Transport) error {
	var offered []string
	d := s.Desc()
	described := d != nil && d.Crescent != nil // a Mooncake peer names none
	if described {
		offered = d.Crescent.Protocols
	}
	running := names(tried)
	e.trMu.RLock()
	var gone []string
	for _, p := range offered {
		if e.removed[p] && !slices.Contains(running, p) {
			gone = append(gone, p)
		}
	}
	e.trMu.RUnlock()
	if len(gone) > 0 {
		return fmt.Errorf("%w: %s offers %v: %w: %s (running here: %v)", ErrNoTransport, s.name, offered,
			ErrTransportUninstalled, strings.Join(gone, ", "), running)
	}
	if described {
		return fmt.Errorf("%w: %s offers %v, running here: %v", ErrNoTransport, s.name, offered, running)
	}
	return fmt.Errorf("%w: %s (running here: %v)", ErrNoTransport, s.name, running)
}

func names(ts []transport.Transport) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Name()
	}
	return out
}
