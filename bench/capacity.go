package main

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The capacity figures users size a Redis by (issue 11, item 4): Redis CPU
// per operation and bytes per completed record, beside Redis's own floor,
// and the 3-master cluster against one master. They come from scenarios 1
// (floor), 5 (scale) and 6 (memory); this file only gathers them.

// clusterServerUsec returns a function that sums the CPU time (user +
// system, INFO cpu) of every cluster master, in µs; nil without a cluster.
func (e *env) clusterServerUsec() func(context.Context) (float64, error) {
	if len(e.clusterAddrs) == 0 {
		return nil
	}
	var cs []*redis.Client
	for _, a := range e.clusterAddrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		e.onClose(func() { c.Close() })
		cs = append(cs, c)
	}
	return func(ctx context.Context) (float64, error) {
		var total float64
		for _, c := range cs {
			u, err := serverCPU(ctx, c)
			if err != nil {
				return 0, err
			}
			total += u
		}
		return total, nil
	}
}

// clusterVsStandalone renders the cluster's throughput over the standalone
// server's, level by level, from the same interleaved rounds.
func clusterVsStandalone(one, cl []scalePoint) string {
	var b strings.Builder
	b.WriteString("Cluster ÷ one master, same rounds:\n\n| clients | idem.Do fresh: cluster ops/s | one master ops/s | cluster ÷ one master | raw floor: cluster ÷ one master | Redis CPU µs per idem.Do: cluster (3 masters) | one master |\n|---:|---:|---:|---:|---:|---:|---:|\n")
	for i := range min(len(one), len(cl)) {
		fmt.Fprintf(&b, "| %d | %.0f | %.0f | **%.2f×** | %.2f× | %s | %s |\n", one[i].clients, cl[i].fresh.opsPerSec(), one[i].fresh.opsPerSec(),
			ratio(cl[i].fresh, one[i].fresh), ratio(cl[i].raw, one[i].raw), fmtF(cl[i].fresh.srvUsecPerOp(), 1), fmtF(one[i].fresh.srvUsecPerOp(), 1))
	}
	return b.String()
}

// floorLoopback returns scenario 1's bare-loopback variants, if it ran.
func (r *report) floorLoopback() (raw, fresh, get, replay *variant) {
	for _, s := range r.sections {
		if !strings.HasPrefix(s.title, "1. Floor: bare loopback") {
			continue
		}
		for _, p := range s.pairs {
			switch p[1].name {
			case "idem.Do, fresh keys":
				raw, fresh = p[0], p[1]
			case "idem.Do, replays":
				get, replay = p[0], p[1]
			}
		}
	}
	return raw, fresh, get, replay
}

// capacity renders the capacity summary, from whatever of scenarios 1, 5, 6
// and 7 ran; empty when none did.
func (r *report) capacity() string {
	var rows []string
	row := func(what, idem, floor, rel, src string) {
		rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s | %s |", what, idem, floor, rel, src))
	}
	perCore := func(us float64) string {
		if math.IsNaN(us) || us <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", 1e6/us)
	}
	if raw, fresh, get, replay := r.floorLoopback(); fresh != nil && replay != nil {
		cl := fmt.Sprintf("§1, %d clients", fresh.clients)
		row("Redis CPU per fresh operation, µs (standalone)", fmtF(fresh.srvUsecPerOp(), 1), fmtF(raw.srvUsecPerOp(), 1)+" (SET NX PX + SET PX)",
			fmtRatio(fresh.srvUsecPerOp()/raw.srvUsecPerOp()), cl)
		row("Redis CPU per replay, µs (standalone)", fmtF(replay.srvUsecPerOp(), 1), fmtF(get.srvUsecPerOp(), 1)+" (GET)",
			fmtRatio(replay.srvUsecPerOp()/get.srvUsecPerOp()), cl)
		row("fresh operations per second one Redis core serves (10⁶ / CPU µs)", perCore(fresh.srvUsecPerOp()), perCore(raw.srvUsecPerOp()), "", cl)
		row("replays per second one Redis core serves", perCore(replay.srvUsecPerOp()), perCore(get.srvUsecPerOp()), "", cl)
	}
	if p := r.peers; p != nil && len(p.goFresh) > goPeerIdems && len(p.goReplay) == len(p.goFresh) {
		var f, rp []string
		for i, v := range p.goFresh[goPeerIdems:] {
			f = append(f, fmt.Sprintf("%s %s", strings.SplitN(v.name, ":", 2)[0], fmtF(v.srvUsecPerOp(), 1)))
			w := p.goReplay[goPeerIdems+i]
			rp = append(rp, fmt.Sprintf("%s %s", strings.SplitN(w.name, ":", 2)[0], fmtF(w.srvUsecPerOp(), 1)))
		}
		idem := func(vs []*variant) string {
			return fmt.Sprintf("%s (WithAutoPipeline: %s)", fmtF(vs[0].srvUsecPerOp(), 1), fmtF(vs[1].srvUsecPerOp(), 1))
		}
		row("Redis CPU per fresh operation, µs, against the alternatives", idem(p.goFresh), strings.Join(f, "; "), "", "§7")
		row("Redis CPU per replay, µs, against the alternatives", idem(p.goReplay), strings.Join(rp, "; "), "", "§7")
	}
	for _, m := range r.mem {
		if m.how != "idem.Do, []byte result, text" && !(m.how == "idem.Do, []byte result, random bytes" && m.body > 1024) {
			continue
		}
		kind := "text"
		if strings.Contains(m.how, "random") {
			kind = "random bytes"
		}
		row(fmt.Sprintf("bytes per completed record, %d B %s body", m.body, kind), fmt.Sprintf("%.0f (body %s)", m.bytesPerRec, strings.TrimPrefix(fmtOverhead(m.overhead()), "body ")),
			fmt.Sprintf("%.0f (plain SET of the body)", m.baseline), fmt.Sprintf("%+.0f B", m.bytesPerRec-m.baseline), "§6")
		if m.body == 200 {
			row("memory for 1 million completed records of 200 B", fmt.Sprintf("%.0f MB", m.bytesPerRec), fmt.Sprintf("%.0f MB", m.baseline), "", "§6")
		}
	}
	for i := range min(len(r.scaleStandalone), len(r.scaleCluster)) {
		one, cl := r.scaleStandalone[i], r.scaleCluster[i]
		if one.clients != r.cfg.clients && i != len(r.scaleCluster)-1 {
			continue
		}
		row(fmt.Sprintf("throughput, 3-master cluster ÷ one master, idem.Do fresh, %d clients (same rounds)", one.clients),
			fmt.Sprintf("%.0f ÷ %.0f ops/s", cl.fresh.opsPerSec(), one.fresh.opsPerSec()),
			fmt.Sprintf("raw floor: %.0f ÷ %.0f", cl.raw.opsPerSec(), one.raw.opsPerSec()),
			fmt.Sprintf("%.2f× (floor %.2f×)", ratio(cl.fresh, one.fresh), ratio(cl.raw, one.raw)), "§5b")
	}
	if len(rows) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n## Capacity: what to size a Redis by\n\n")
	b.WriteString("Redis CPU per operation is redis-server's user + system CPU (`INFO cpu`) over the measured rounds divided by the operations, " +
		"socket I/O included, measured on loopback with the client on the same cores (a busier server batches more per wake-up and " +
		"spends less per operation). Memory is `MEMORY USAGE` summed over the keys a completed record leaves. No target is set for these " +
		"figures; they are what to multiply by your traffic and retention.\n\n")
	b.WriteString("| figure | idem | Redis's floor (or the alternatives) | idem ÷ floor | from |\n|---|---:|---:|---:|---|\n")
	b.WriteString(strings.Join(rows, "\n") + "\n")
	return b.String()
}

func fmtRatio(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	return fmt.Sprintf("%.2f×", x)
}
