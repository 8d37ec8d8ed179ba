// Package paydemo is the payments API of the examples, its replicas, and the
// demo that plays the design's scenarios against them: a double click, a
// lost answer, a changed cart, a reused key, a replica killed mid-charge.
// examples/payments books payments in memory; examples/sqlpayments books
// them in a SQL database with package idemsql and adds the scenario where
// Redis forgets.
package paydemo
