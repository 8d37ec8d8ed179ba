package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/redis/go-redis/v9"
)

// scalePoint is one (concurrency, topology) measurement for the chart.
type scalePoint struct {
	clients    int
	raw, fresh *variant
}

// freshPair returns the raw two-round-trip floor and Do on fresh keys over
// client c (hook h), with clients workers.
func freshPair(e *env, tag string, clients int, c redis.UniversalClient, h *rtHook, srv func(context.Context) (float64, error)) (raw, fresh *variant) {
	base := "s-" + e.nonce + "-" + tag
	rawKeys := keyer(base + "-raw")
	raw = &variant{
		name: fmt.Sprintf("raw SET NX PX + SET PX, %d clients", clients), clients: clients, rt: h.n, srv: srv,
		op: func(ctx context.Context, w int, seq uint64) error {
			k := "raw:{" + rawKeys.key(w, seq) + "}"
			ok, err := c.SetNX(ctx, k+":l", "owner-token-0123456", 30*time.Second).Result()
			if err != nil {
				return err
			}
			if !ok {
				return errors.New("raw SET NX found the key taken")
			}
			return c.Set(ctx, k, rawPayload, retention).Err()
		},
	}
	g := e.guard(c, base+"-do")
	keys := keyer("k")
	fresh = &variant{
		name: fmt.Sprintf("idem.Do fresh, %d clients", clients), clients: clients, rt: h.n, srv: srv,
		op: func(ctx context.Context, w int, seq uint64) error {
			_, err := idem.Do(ctx, g, keys.key(w, seq), theReq, func(ctx context.Context, a *idem.Attempt) (payment, error) {
				return thePayment, nil
			})
			return err
		},
	}
	return raw, fresh
}

// scaleScale is the share of -duration each scale comparison measures per
// variant: it runs 4 variants at each of 4 levels, and the full run has a
// time budget of about 5 minutes.
const scaleScale = 0.4

// runScale is scenario 5: throughput against client concurrency, on the
// standalone server and on a 3-master Redis Cluster. At each level the
// standalone and the cluster pairs run interleaved in the same rounds, so
// that cluster ÷ one master is a same-run ratio.
func runScale(ctx context.Context, e *env) error {
	cfg := scaled(e.cfg, scaleScale)
	progress("scenario 5: scale, clients %v", e.cfg.levels)
	sec := e.rep.section("5. Scale: throughput vs client concurrency, standalone Redis",
		fmt.Sprintf("Fresh keys; each level is measured raw floor beside idem.Do, interleaved, each side with its own go-redis client (pool ≥ clients); "+
			"%v per variant in %d rounds (-duration × %g: this scenario has no target, and §1 measures 16 clients in full).", cfg.duration, cfg.rounds, scaleScale))
	var csec *section
	if len(e.clusterAddrs) == 0 {
		e.rep.section("5b. Scale on a 3-master Redis Cluster", "Skipped: "+e.clusterNote)
		progress("scenario 5b: cluster skipped: %s", e.clusterNote)
	} else {
		progress("scenario 5b: 3-master Redis Cluster, interleaved with the standalone server")
		csec = e.rep.section("5b. Scale on a 3-master Redis Cluster",
			fmt.Sprintf("Three cluster-enabled redis-server masters on loopback (%s), `redis.ClusterClient`; "+
				"round trips are counted at the cluster client (each command goes to one node); srv µs/op is the CPU of the three masters "+
				"together (`INFO cpu` of each). Each level runs in the same interleaved rounds as the standalone pair of section 5. All three "+
				"masters share this machine's cores with the client, so the cluster shows correctness and routing cost, not scaling.", e.clusterNote))
	}
	clusterSrv := e.clusterServerUsec()
	for _, n := range e.cfg.levels {
		c, h := e.client(0, n)
		raw, fresh := freshPair(e, fmt.Sprintf("c%d", n), n, c, h, e.serverUsec)
		vs := []*variant{raw, fresh}
		var craw, cfresh *variant
		if csec != nil {
			cc, ch := e.clusterClient(n)
			craw, cfresh = freshPair(e, fmt.Sprintf("cl%d", n), n, cc, ch, clusterSrv)
			vs = append(vs, craw, cfresh)
		}
		if err := compare(ctx, cfg, fmt.Sprintf("scale, %d clients", n), vs...); err != nil {
			return err
		}
		sec.pair(raw, fresh)
		e.rep.scaleStandalone = append(e.rep.scaleStandalone, scalePoint{n, raw, fresh})
		if csec != nil {
			csec.pair(craw, cfresh)
			e.rep.scaleCluster = append(e.rep.scaleCluster, scalePoint{n, craw, cfresh})
		}
	}
	if csec != nil {
		csec.body = clusterVsStandalone(e.rep.scaleStandalone, e.rep.scaleCluster)
	}
	return nil
}
