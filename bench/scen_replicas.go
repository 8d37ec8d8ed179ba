package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// Scenario 8, "replicas": what idem.WithReplicaAck costs on a primary with
// one replica. With acks on, every claim and completion is pipelined with a
// WAIT on its connection, and a replay does a small write (the record's TTL
// set again) and a WAIT, so that it hands out only what a replica holds.

// replicaAckTimeout is the WAIT timeout of the acknowledged variants.
const replicaAckTimeout = time.Second

// replicaScale is the share of -duration each replica comparison measures
// per variant.
const replicaScale = 0.5

// startReplicaPair starts a primary and a replica of it (--replicaof) on
// 127.0.0.1, and returns once the replica's link is up and a WAIT behind a
// write on the primary was acknowledged by it.
func startReplicaPair(ctx context.Context, s *servers, bin string) (primary, replica string, err error) {
	// A diskless full sync waits 5 s by default for more replicas to join.
	if primary, err = s.startRedis(ctx, bin, "--repl-diskless-sync-delay", "0"); err != nil {
		return "", "", err
	}
	host, port, _ := strings.Cut(primary, ":")
	if replica, err = s.startRedis(ctx, bin, "--replicaof", host, port); err != nil {
		return "", "", err
	}
	pc := redis.NewClient(&redis.Options{Addr: primary, PoolSize: 1})
	defer pc.Close()
	rc := redis.NewClient(&redis.Options{Addr: replica})
	defer rc.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := rc.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", "", fmt.Errorf("replica %s: link to %s not up: %v", replica, primary, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for {
		var wait *redis.IntCmd
		_, err := pc.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, "bench:replica-probe", "1", time.Minute)
			wait = redis.NewIntCmd(ctx, "wait", 1, 1000)
			return p.Process(ctx, wait)
		})
		if err == nil && wait.Val() >= 1 {
			return primary, replica, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", "", fmt.Errorf("replica %s: WAIT 1 on %s never acknowledged (%d, %v)", replica, primary, wait.Val(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// countedClient is a go-redis client on addr whose round trips are counted.
func countedClient(e *env, addr string, poolSize int) (*redis.Client, *rtHook) {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: max(poolSize, 16), ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
	h := newRTHook(0)
	c.AddHook(h)
	e.onClose(func() { c.Close() })
	return c, &h
}

// runReplicas is scenario 8.
func runReplicas(ctx context.Context, e *env) error {
	clients := e.cfg.clients
	cfg := scaled(e.cfg, replicaScale)
	progress("scenario 8: replica acks, primary + 1 replica, %d clients", clients)
	var s servers
	defer s.stop()
	primary, replica, err := startReplicaPair(ctx, &s, e.cfg.redisServer)
	if err != nil {
		e.rep.section("8. Replica acks: WithReplicaAck(1, 1s) on a primary with one replica", "Skipped: "+firstLine(err.Error()))
		progress("  skipped: %v", err)
		return nil
	}
	admin := redis.NewClient(&redis.Options{Addr: primary})
	defer admin.Close()
	srv := func(ctx context.Context) (float64, error) { return serverCPU(ctx, admin) }

	mk := func(name, tag string, ack, replay bool) *variant {
		c, h := countedClient(e, primary, clients)
		opts := []idem.RedisOption{idem.WithPrefix("rp" + tag + "-" + e.nonce)}
		if ack {
			opts = append(opts, idem.WithReplicaAck(1, replicaAckTimeout))
		}
		g := idem.New(idem.NewRedisStore(c, opts...), idem.WithRetention(retention))
		var ran atomic.Int64
		fn := func(ctx context.Context, a *idem.Attempt) (payment, error) { ran.Add(1); return thePayment, nil }
		v := &variant{name: name, clients: clients, rt: h.n, srv: srv}
		if !replay {
			keys := keyer("k")
			v.op = func(ctx context.Context, w int, seq uint64) error {
				_, err := idem.Do(ctx, g, keys.key(w, seq), theReq, fn)
				return err
			}
			return v
		}
		n := e.cfg.replayKeys
		keys := make([]string, n)
		for i := range keys {
			keys[i] = "r-" + strconv.Itoa(i)
		}
		var ran0 int64
		v.setup = func(ctx context.Context) error {
			err := populate(ctx, n, func(ctx context.Context, i int) error { _, err := idem.Do(ctx, g, keys[i], theReq, fn); return err })
			ran0 = ran.Load()
			return err
		}
		v.op = func(ctx context.Context, w int, seq uint64) error {
			p, err := idem.Do(ctx, g, keys[(uint64(w)*7919+seq)%uint64(n)], theReq, fn)
			if err == nil && p.ID != thePayment.ID {
				err = fmt.Errorf("replay returned %+v", p)
			}
			if err == nil && ran.Load() != ran0 {
				err = errors.New("a replay ran the function again")
			}
			return err
		}
		return v
	}
	ackName := fmt.Sprintf("WithReplicaAck(1, %v)", replicaAckTimeout)
	freshNo := mk("idem.Do fresh, no replica ack", "fn", false, false)
	freshAck := mk("idem.Do fresh, "+ackName, "fa", true, false)
	replayNo := mk("idem.Do replay, no replica ack", "rn", false, true)
	replayAck := mk("idem.Do replay, "+ackName, "ra", true, true)
	if err := compare(ctx, cfg, "replicas, fresh", freshNo, freshAck); err != nil {
		return err
	}
	if err := compare(ctx, cfg, "replicas, replay", replayNo, replayAck); err != nil {
		return err
	}

	sec := e.rep.section("8. Replica acks: "+ackName+" on a primary with one replica", fmt.Sprintf(
		"A redis-server primary (%s) and a replica started with `--replicaof` (%s), both on loopback and on this machine's cores; "+
			"the run starts once the replica reports `master_link_status:up` and a `WAIT 1` behind a write was acknowledged. %d clients, "+
			"each variant its own go-redis client, interleaved in %d rounds of %v. With acks, every claim and completion is pipelined "+
			"with `WAIT 1 %d` on the same connection (one round trip), and a replay does a small write (the record's TTL set again) "+
			"and the `WAIT`, so that it returns only a result a replica holds. srv µs/op is the primary's CPU (it also feeds the replica).",
		primary, replica, clients, cfg.rounds, cfg.duration/time.Duration(cfg.rounds), replicaAckTimeout.Milliseconds()))
	sec.pair(freshNo, freshAck)
	sec.pair(replayNo, replayAck)
	var b strings.Builder
	b.WriteString("| | throughput with acks (× without) | p50 without → with | p50 added | p99 without → with | primary CPU µs/op added |\n|---|---:|---:|---:|---:|---:|\n")
	for _, p := range [][2]*variant{{freshNo, freshAck}, {replayNo, replayAck}} {
		what := "fresh Do"
		if p[0] == replayNo {
			what = "replay"
		}
		fmt.Fprintf(&b, "| %s | **%.2f×** | %s → %s | %s | %s → %s | %s |\n", what, ratio(p[1], p[0]),
			fmtDur(p[0].lat.quantile(0.5)), fmtDur(p[1].lat.quantile(0.5)), fmtDelta(p[1].lat.quantile(0.5)-p[0].lat.quantile(0.5)),
			fmtDur(p[0].lat.quantile(0.99)), fmtDur(p[1].lat.quantile(0.99)), fmtSigned(p[1].srvUsecPerOp()-p[0].srvUsecPerOp()))
	}
	sec.body = b.String()
	e.rep.chartExtra = append(e.rep.chartExtra,
		chartRatio{"replica ack fresh", ratio(freshAck, freshNo), math.NaN()},
		chartRatio{"replica ack replay", ratio(replayAck, replayNo), math.NaN()})
	return nil
}

func fmtSigned(f float64) string {
	if math.IsNaN(f) {
		return "-"
	}
	return fmt.Sprintf("%+.1f", f)
}
