// Package idemstore defines the interface between package idem and the
// stores that keep its records, as database/sql/driver does for
// database/sql. Applications use package idem and its RedisStore; this
// package is for those who write, wrap or test a store.
//
// A store keeps one record per operation, addressed by the operation's id,
// and takes it through claim, heartbeat, checkpoint, complete and release,
// each one atomic step. Store is the interface every store implements;
// Reader and Watcher are optional interfaces the engine and the tests use
// when a store has them. Package idemtest checks any implementation against
// the contract.
package idemstore
