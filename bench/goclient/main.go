// A fenced one-row transaction through the Go module pgfencing (pgxfence with pgx v4, sqlfence
// with database/sql and lib/pq) against the same transaction unfenced through the same driver
// (issue 46), and against its floor (the same Fenced call and token on an unprotected table, the
// token stamped by the statement: no check). One connection per driver, BENCH_ROUNDS rounds of
// BENCH_TXNS transactions of each variant interleaved transaction by transaction, the median
// latency of a transaction per round, then the median over rounds. Run by bench/goclient.sh.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pg-fencing/pg_fencing/clients/go/pgxfence"
	"github.com/pg-fencing/pg_fencing/clients/go/sqlfence"

	"github.com/jackc/pgx/v4"
)

func env(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// rounds runs the variants interleaved transaction by transaction (the order rotating) and
// returns, per variant, the median over rounds of each round's median latency (µs).
func rounds(rs, txns int, variants []func(int) error) []float64 {
	per := make([][]float64, len(variants))
	for r := 0; r < rs; r++ {
		lat := make([][]float64, len(variants))
		for i := 0; i < txns; i++ {
			for k := range variants {
				n := (i + k) % len(variants)
				t0 := time.Now()
				must(variants[n](i))
				lat[n] = append(lat[n], float64(time.Since(t0).Nanoseconds())/1000)
			}
		}
		for n := range variants {
			per[n] = append(per[n], median(lat[n]))
		}
	}
	out := make([]float64, len(variants))
	for n := range per {
		out[n] = median(per[n])
	}
	return out
}

func main() {
	url := flag.String("url", "", "PostgreSQL URL")
	outFile := flag.String("out", "", "the Markdown table's file")
	flag.Parse()
	rs, txns := env("BENCH_ROUNDS", 7), env("BENCH_TXNS", 2000)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, *url)
	must(err)
	for _, q := range []string{
		"DROP TABLE IF EXISTS gb_fenced, gb_plain",
		"CREATE TABLE gb_fenced (id int PRIMARY KEY, v int)",
		"CREATE TABLE gb_plain (id int PRIMARY KEY, v int, fence_token bigint)",
		"SELECT fencing_protect('gb_fenced', 'gobench')",
		"SELECT fencing_advance('gobench', 5)",
		"BEGIN; SET LOCAL pg_fencing.token = '5'; INSERT INTO gb_fenced (id, v) SELECT g, 0 FROM generate_series(1, 1000) g; INSERT INTO gb_plain (id, v) SELECT g, 0 FROM generate_series(1, 1000) g; COMMIT",
	} {
		_, err := admin.Exec(ctx, q)
		must(err)
	}
	key := func(i int) int { return i%1000 + 1 }
	c, err := pgx.Connect(ctx, *url)
	must(err)
	exec := func(q string, i int) func(context.Context, *pgx.Conn) error {
		return func(ctx context.Context, c *pgx.Conn) error { _, err := c.Exec(ctx, q, key(i)); return err }
	}
	pgxRes := rounds(rs, txns, []func(int) error{
		func(i int) error {
			return pgxfence.Fenced(ctx, c, 5, exec("UPDATE gb_fenced SET v = v + 1 WHERE id = $1", i))
		},
		func(i int) error {
			return pgxfence.Fenced(ctx, c, 5, exec("UPDATE gb_plain SET v = v + 1, fence_token = 5 WHERE id = $1", i))
		},
		func(i int) error {
			tx, err := c.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE gb_plain SET v = v + 1 WHERE id = $1", key(i)); err != nil {
				return err
			}
			return tx.Commit(ctx)
		},
	})
	sep := "?"
	if strings.Contains(*url, "?") {
		sep = "&"
	}
	db, err := sql.Open("postgres", *url+sep+"sslmode=disable")
	must(err)
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	sqlExec := func(q string, i int) func(context.Context, *sql.Conn) error {
		return func(ctx context.Context, c *sql.Conn) error { _, err := c.ExecContext(ctx, q, key(i)); return err }
	}
	sqlRes := rounds(rs, txns, []func(int) error{
		func(i int) error {
			return sqlfence.Fenced(ctx, db, 5, sqlExec("UPDATE gb_fenced SET v = v + 1 WHERE id = $1", i))
		},
		func(i int) error {
			return sqlfence.Fenced(ctx, db, 5, sqlExec("UPDATE gb_plain SET v = v + 1, fence_token = 5 WHERE id = $1", i))
		},
		func(i int) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, "UPDATE gb_plain SET v = v + 1 WHERE id = $1", key(i)); err != nil {
				tx.Rollback()
				return err
			}
			return tx.Commit()
		},
	})
	var b strings.Builder
	fmt.Fprintf(&b, "PostgreSQL 15, one connection per driver on loopback (fsync off); %d rounds of %d one-row UPDATE transactions of each variant, interleaved transaction by transaction; median latency per transaction.\n\n", rs, txns)
	b.WriteString("| driver | fenced (µs) | floor (µs) | unfenced (µs) | fenced / floor | fenced / unfenced |\n|---|---:|---:|---:|---:|---:|\n")
	for _, row := range []struct {
		name string
		r    []float64
	}{{"pgx v4 (pgxfence.Fenced)", pgxRes}, {"database/sql, lib/pq (sqlfence.Fenced)", sqlRes}} {
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %.0f | %.3f | %.3f |\n", row.name, row.r[0], row.r[1], row.r[2], row.r[0]/row.r[1], row.r[0]/row.r[2])
	}
	fmt.Print(b.String())
	if *outFile != "" {
		must(os.WriteFile(*outFile, []byte(b.String()), 0o644))
	}
}
