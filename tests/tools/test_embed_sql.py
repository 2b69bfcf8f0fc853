"""tools/embed_sql.py refuses queries whose descriptors would not match their
SQL, and describes the ones it accepts (the pg suite then checks those
descriptions against PostgreSQL: tests/pg/queries_pgtest.cpp)."""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "embed_sql.py"
MIGRATIONS = sorted(str(p) for p in (ROOT / "sql").glob("[0-9][0-9][0-9][0-9]_*.sql"))


def embed(tmp_path, queries):
    path = tmp_path / "queries.sql"
    path.write_text(queries)
    run = subprocess.run([sys.executable, str(TOOL), "--output", str(tmp_path / "e.cpp"),
                          "--header", str(tmp_path / "q.hpp"), "--queries", str(path),
                          "--migrations", *MIGRATIONS], capture_output=True, text=True)
    header = (tmp_path / "q.hpp").read_text() if run.returncode == 0 else ""
    return run.returncode, run.stderr, header


def test_a_query_is_described_by_its_parameters_and_columns(tmp_path):
    rc, err, header = embed(tmp_path, """-- name: reschedule
-- params: id, owner
-- $9 in a comment is not a parameter, nor ':word' in a literal
UPDATE :"schema".events SET last_error = ':nope' WHERE id = $1 AND lease_owner = $2
RETURNING id, available_at::text, now() - created_at AS age;
""")
    assert rc == 0, err
    assert 'params = std::array<std::string_view, 2>{"id", "owner"}' in header
    assert "enum class col : int { id, available_at, age };" in header
    assert "T0 id;  // $1" in header


def test_the_columns_of_a_statement_with_materialized_ctes_are_its_final_selects(tmp_path):
    rc, err, header = embed(tmp_path, """-- name: window
WITH s AS MATERIALIZED (SELECT 1 AS a), w AS NOT MATERIALIZED (SELECT 2 AS b), p AS (SELECT 3 AS c)
SELECT s.a, w.b AS bee FROM s, w, p;
""")
    assert rc == 0, err
    assert "enum class col : int { a, bee };" in header


def test_a_variant_is_a_statement_of_its_own_with_its_extra_parameters(tmp_path):
    rc, err, header = embed(tmp_path, """-- name: claim
-- params: owner
-- variant claim: :where = true
-- variant claim_from (mark): :where = id > $2
SELECT id FROM :"schema".events WHERE lease_owner = $1 AND :where LIMIT :size;
""")
    assert rc == 0, err
    assert "struct claim_from {" in header
    assert 'std::array<std::string_view, 2>{"owner", "mark"}' in header
    assert "fragment size;" in header and "fragment where;" not in header


def test_a_variant_that_fills_every_placeholder_runs_its_own_text(tmp_path):
    rc, err, header = embed(tmp_path, """-- name: park
-- params: ids
-- variant park: :fence = slot IN (SELECT slot FROM mine)
-- variant park_early: :fence = txid IS NULL
SELECT id FROM :"schema".events WHERE id = ANY ($1) AND :fence;
""")
    assert rc == 0, err
    code = (tmp_path / "e.cpp").read_text()
    # Each variant's text is embedded whole, and its descriptor points at it.
    assert "WHERE id = ANY ($1) AND slot IN (SELECT slot FROM mine);" in code
    assert "WHERE id = ANY ($1) AND txid IS NULL;" in code
    sources = [line.split("=")[1].strip(" ;") for line in header.splitlines() if "std::size_t source" in line]
    assert len(sources) == 2 and sources[0] != sources[1]
    assert "struct fills" not in header


@pytest.mark.parametrize("sql, message", [
    ("SELECT id FROM t WHERE id = $1;", "uses $1 but declares no name for it"),
    ("-- params: id, owner\nSELECT id FROM t WHERE id = $1;", "declares $2 (owner) but never uses it"),
    ("-- params: a\nSELECT id FROM t WHERE id = $1 OR id = $3;", "uses $3 but declares no name"),
    ("SELECT id, count(*) > 1 FROM t;", "result column 1 ('count() > 1') has no name"),
    ("SELECT id, topic FROM t UNION ALL SELECT NULL FROM t;", "branch 2 of its UNION returns 1 columns, the first 2"),
    ("SELECT t.id, u.id FROM t, u;", "two result columns named id"),
    ("-- variant other: :nothing = true\nSELECT id FROM t;", "fills :nothing, which the query does not have"),
    ("-- params: values\nSELECT $1 AS x;", "'values' is not usable as a C++ name"),
])
def test_a_query_that_does_not_match_its_description_fails_the_build(tmp_path, sql, message):
    rc, err, _ = embed(tmp_path, "-- name: q\n" + sql + "\n")
    assert rc == 1
    assert message in err


def test_a_fragment_is_included_where_a_query_names_it(tmp_path):
    rc, err, header = embed(tmp_path, """-- name: a
SELECT id,
-- include: tail

-- name: b
SELECT id, owner,
-- include: tail

-- fragment: tail
-- the columns both share, and their table
       $1::text AS note FROM :"schema".events WHERE id > :floor;
""")
    assert rc == 1  # $1 needs a name in each query that includes it
    assert "query a: uses $1 but declares no name for it" in err
    rc, err, header = embed(tmp_path, """-- name: a
-- params: note
SELECT id,
-- include: tail

-- name: b
-- params: note
SELECT id, owner,
-- include: tail

-- fragment: tail
       $1::text AS note FROM :"schema".events WHERE id > :floor;
""")
    assert rc == 0, err
    assert "enum class col : int { id, note };" in header
    assert "enum class col : int { id, owner, note };" in header
    assert header.count("fragment floor;") == 2


@pytest.mark.parametrize("sql, message", [
    ("-- name: q\n-- include: nowhere\nSELECT 1 AS one;\n", "query q includes an unknown fragment nowhere"),
    ("-- name: q\nSELECT 1 AS one;\n-- fragment: spare\nSELECT 2;\n", "fragment spare is included nowhere"),
    ("-- name: q\n-- include: f\n-- fragment: f\nSELECT 1 AS one;\n-- fragment: f\nSELECT 2;\n",
     "duplicate fragment name f"),
    ("-- name: q\n-- include: f\n-- fragment: f\n-- variant q: :x = 1\nSELECT 1 AS one;\n",
     "a fragment holds SQL only"),
])
def test_a_fragment_that_is_unknown_unused_twice_or_not_sql_fails_the_build(tmp_path, sql, message):
    rc, err, _ = embed(tmp_path, sql)
    assert rc == 1
    assert message in err


def test_the_claim_without_keys_starts_where_the_claim_does_in_each_variant():
    # claim_unkeyed repeats the claim's variant lines under its own names
    # (a fragment holds SQL only); the relay follows one with the other
    # from the same place, so they must agree on where each variant starts.
    sys.path.insert(0, str(TOOL.parent))
    import embed_sql
    queries = {q.name: q for q in embed_sql.load_queries(ROOT / "src" / "pg" / "queries.sql")}
    full, unkeyed = queries["claim"], queries["claim_unkeyed"]
    assert unkeyed.params == full.params
    assert sorted(unkeyed.variants) == sorted(v.replace("claim", "claim_unkeyed", 1) for v in full.variants)
    for name, (extras, fills) in full.variants.items():
        assert unkeyed.variants[name.replace("claim", "claim_unkeyed", 1)] == (extras, fills), name
