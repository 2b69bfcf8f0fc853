#!/usr/bin/env python3
"""Embeds sql/NNNN_name.sql migrations and the named runtime queries into a
C++ source file, so the binary can never drift from sql/, and writes a header
of typed query descriptors (pg/queries.hpp), so code that runs a query cannot
drift from its SQL either.

Refuses (exit 1) a migration file whose name does not match NNNN_name.sql, a
duplicate number, a gap in the numbering, a migration from 0004 on that does
not record itself in schema_migrations as its last statement (see
record_line; 0001-0003 were published before the rule, and 0004 records
them), a query block without a name, duplicate query names, and a fragment
that is unknown, duplicated or included nowhere.

Fragments: `-- fragment: NAME` starts a block of SQL shared by queries
(until the next marker), and a line `-- include: NAME` in a query stands for
its lines, before anything below is read.

Per query, it reads from the SQL (comments and string literals aside):
  * the parameters $1..$n; a query that has any declares their names in a
    `-- params: a, b, ...` line, and the numbers used must be exactly 1..n;
  * the result columns: the first SELECT list of the statement (every branch
    of a UNION must have as many), or its RETURNING list; each needs a name
    PostgreSQL would give it too (a column, a function call, or AS alias);
  * placeholders `:word`, filled in when the statement is rendered (each
    occurrence of a word with the same text). A
    `-- variant NAME (extra, params): :word = SQL` line fixes one of them for
    the variant NAME, which becomes a query of its own (its parameters: the
    query's, then the extra ones); the others are filled in at run time.
The header declares, per query (or variant), a struct in outboxd::pg::q with
its name, parameter names, an `args` aggregate with one member per parameter
(designated initializers: a missing, extra or misnamed parameter does not
compile), an enum of its columns (a column that is gone does not compile),
and, with placeholders, a `fills` aggregate. Directive lines are not part of
the embedded text. Used by meson; no third-party modules.
"""
import argparse
import pathlib
import re
import sys

MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
QUERY_MARKER = re.compile(r"^-- name: ([a-z0-9_]+)\s*$")
FRAGMENT_MARKER = re.compile(r"^-- fragment: ([a-z0-9_]+)\s*$")
INCLUDE_LINE = re.compile(r"^-- include: ([a-z0-9_]+)\s*$")
PARAMS_LINE = re.compile(r"^-- params: (.*)$")
VARIANT_LINE = re.compile(r"^-- variant ([a-z0-9_]+)(?: \(([a-z0-9_, ]+)\))?: :([a-z_][a-z0-9_]*) = (.+)$")
IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
PARAM_REF = re.compile(r"\$(\d+)")
PLACEHOLDER = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
DELIMITER = "outboxd_sql"
# Names an `args` struct uses itself, and C++ keywords a column or parameter
# might plausibly be called.
RESERVED = {"query_type", "values", "default", "delete", "new", "case", "class", "operator", "private",
            "public", "template", "this", "union", "using", "and", "or", "not", "int", "bool", "char", "long",
            "short", "auto", "register", "return", "switch", "do", "for", "while", "if", "else"}


def fail(message):
    print(f"embed_sql: {message}", file=sys.stderr)
    sys.exit(1)


# The first migration that records itself; the ones before it were
# published without the line and are never edited.
FIRST_SELF_RECORDING = 4


def record_line(version, name):
    """The statement every migration ends with: applied on its own (psql,
    another migration tool) it leaves the outbox as `outboxd migrate` would.
    `outboxd migrate` records the version first, so then it does nothing."""
    return (f"INSERT INTO :\"schema\".schema_migrations (version, name) VALUES ({version}, '{name}')\n"
            f"    ON CONFLICT (version) DO NOTHING;")


def load_migrations(paths):
    found = {}
    for path in paths:
        path = pathlib.Path(path)
        match = MIGRATION_NAME.match(path.name)
        if not match:
            fail(f"{path}: migration files are named NNNN_name.sql (lower case)")
        version = int(match.group(1))
        if version in found:
            fail(f"{path}: duplicate migration number {version:04d} (also {found[version][0]})")
        text = path.read_text(encoding="utf-8")
        if version >= FIRST_SELF_RECORDING and not text.rstrip().endswith(record_line(version, match.group(2))):
            fail(f"{path}: must end by recording itself:\n{record_line(version, match.group(2))}")
        found[version] = (path, match.group(2), text)
    if not found:
        fail("no migrations given")
    expected = list(range(1, len(found) + 1))
    if sorted(found) != expected:
        missing = sorted(set(range(1, max(found) + 1)) - set(found))
        fail(f"migration numbers must run 1..N without gaps; missing {missing}")
    return [(v, found[v][1], found[v][2]) for v in expected]


# ---- reading SQL -------------------------------------------------------------

def code_only(sql):
    """The SQL with comments and the insides of string literals blanked out
    (same length, so offsets still point into the original text)."""
    out = []
    i = 0
    n = len(sql)
    while i < n:
        ch = sql[i]
        if sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end < 0 else end
            out.append(" " * (end - i))
            i = end
        elif ch == "'":
            end = i + 1
            while end < n:
                if sql[end] == "'" and sql.startswith("''", end):
                    end += 2
                elif sql[end] == "'":
                    break
                else:
                    end += 1
            out.append("'" + " " * (end - i - 1) + "'")
            i = end + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def flatten(code):
    """Depth-0 text only: everything inside parentheses becomes ()."""
    out = []
    depth = 0
    for ch in code:
        if ch == "(":
            if depth == 0:
                out.append("(")
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                out.append(")")
        elif depth == 0:
            out.append(ch)
    return " ".join("".join(out).split())


def split_top(text, separator):
    """Splits flattened text at a separator (a regex) that stands at depth 0."""
    return [part.strip() for part in re.split(separator, text)]


def column_name(item):
    """The name PostgreSQL gives a select-list item, or None when it would
    call it ?column? (then the query must give it an AS alias)."""
    alias = re.search(r"\bAS\s+([a-z_][a-z0-9_]*)$", item, re.IGNORECASE)
    if alias:
        return alias.group(1)
    bare = re.sub(r"(\s*::\s*[a-z0-9_ ]+(\[\])?)+$", "", item)
    m = re.match(r'^(?:(?::?"[^"]*"|[a-z_][a-z0-9_]*)\.)*([a-z_][a-z0-9_]*)(\(\))?$', bare)
    if m and m.group(1).upper() not in ("NULL", "TRUE", "FALSE"):
        return m.group(1)
    return None


def result_columns(query, statement):
    """The names of the statement's result columns ([] if it returns none)."""
    flat = flatten(statement)
    flat = re.sub(r"^WITH\s+(?:[a-z_][a-z0-9_]*\s+AS\s+(?:(?:NOT\s+)?MATERIALIZED\s+)?\(\)\s*,?\s*)+", "", flat,
                  flags=re.IGNORECASE)
    if re.match(r"^SELECT\b", flat, re.IGNORECASE):
        branches = split_top(flat, r"\bUNION(?:\s+ALL)?\b")
        lists = []
        for branch in branches:
            body = re.sub(r"^SELECT\s+(?:DISTINCT(?:\s+ON\s*\(\))?\s+)?", "", branch, flags=re.IGNORECASE)
            body = re.split(r"\b(?:FROM|WHERE|GROUP|ORDER|LIMIT|FOR)\b", body, maxsplit=1, flags=re.IGNORECASE)[0]
            lists.append(split_top(body, r","))
        for i, other in enumerate(lists[1:], start=2):
            if len(other) != len(lists[0]):
                fail(f"query {query}: branch {i} of its UNION returns {len(other)} columns, the first {len(lists[0])}")
        items = lists[0]
    else:
        returning = re.split(r"\bRETURNING\b", flat, maxsplit=1, flags=re.IGNORECASE)
        if len(returning) < 2:
            return []
        items = split_top(returning[1], r",")
    names = []
    for position, item in enumerate(items):
        name = column_name(item)
        if name is None:
            fail(f"query {query}: result column {position} ({item!r}) has no name; give it one with AS")
        if name in names:
            fail(f"query {query}: two result columns named {name}; rename one with AS")
        names.append(name)
    return names


def statements(code):
    return [s for s in code.split(";") if s.strip()]


class Query:
    def __init__(self, name, text, params, variants):
        self.name = name
        self.text = text          # as embedded: directive lines removed
        self.params = params      # declared parameter names
        self.variants = variants  # name -> (extra params, {placeholder: SQL})


def check_ident(path, what, name):
    if not IDENT.match(name) or name in RESERVED:
        fail(f"{path}: {what} {name!r} is not usable as a C++ name")


def load_queries(path):
    blocks = []
    fragments = {}
    shared = None  # the lines of the fragment being read
    for line in pathlib.Path(path).read_text(encoding="utf-8").splitlines():
        marker = QUERY_MARKER.match(line)
        if marker:
            if any(b[0] == marker.group(1) for b in blocks):
                fail(f"{path}: duplicate query name {marker.group(1)}")
            blocks.append([marker.group(1), [], None, {}])
            shared = None
            continue
        named = FRAGMENT_MARKER.match(line)
        if named:
            if named.group(1) in fragments:
                fail(f"{path}: duplicate fragment name {named.group(1)}")
            shared = fragments[named.group(1)] = []
            continue
        if shared is not None:
            if INCLUDE_LINE.match(line) or line.startswith("-- variant") or line.startswith("-- params"):
                fail(f"{path}: a fragment holds SQL only: {line}")
            shared.append(line)
            continue
        if not blocks:
            if line.strip() and not line.startswith("--"):
                fail(f"{path}: SQL before the first '-- name:' marker")
            continue
        block = blocks[-1]
        params = PARAMS_LINE.match(line)
        variant = VARIANT_LINE.match(line)
        if params:
            if block[2] is not None:
                fail(f"{path}: query {block[0]} has two '-- params:' lines")
            block[2] = [p.strip() for p in params.group(1).split(",")]
            for p in block[2]:
                check_ident(path, f"parameter of {block[0]}", p)
        elif variant:
            vname, extra, placeholder, fragment = variant.groups()
            extras, fills = block[3].setdefault(vname, (None, {}))
            if extra is not None:
                if extras is not None:
                    fail(f"{path}: variant {vname} names its extra parameters twice")
                extras = [p.strip() for p in extra.split(",")]
            if placeholder in fills:
                fail(f"{path}: variant {vname} fills :{placeholder} twice")
            fills[placeholder] = fragment
            block[3][vname] = (extras, fills)
        elif line.startswith("-- variant") or line.startswith("-- params"):
            fail(f"{path}: cannot read this directive of {block[0]}: {line}")
        else:
            block[1].append(line)
    used = set()

    def expand(name, lines):
        out = []
        for line in lines:
            include = INCLUDE_LINE.match(line)
            if not include:
                out.append(line)
                continue
            if include.group(1) not in fragments:
                fail(f"{path}: query {name} includes an unknown fragment {include.group(1)}")
            used.add(include.group(1))
            out.extend(fragments[include.group(1)])
        return out

    queries = []
    for name, lines, params, variants in blocks:
        text = "\n".join(expand(name, lines)).strip()
        if not text:
            fail(f"{path}: query {name} is empty")
        queries.append(Query(name, text + "\n", params or [], {
            v: (extras or [], fills) for v, (extras, fills) in variants.items()}))
    for name in fragments.keys() - used:
        fail(f"{path}: fragment {name} is included nowhere")
    return queries


# ---- descriptors -------------------------------------------------------------

class Descriptor:
    """One statement as code runs it: a query, or one variant of a query."""

    def __init__(self, name, source, params, columns, pieces, slots):
        self.name = name
        self.source = source    # index of its query in embedded::queries()
        self.params = params
        self.columns = columns
        self.pieces = pieces    # text around the run-time placeholders
        self.slots = slots      # placeholder names between the pieces


def check_params(where, code, params):
    used = {int(n) for n in PARAM_REF.findall(code)}
    wanted = set(range(1, len(params) + 1))
    if used != wanted:
        missing = sorted(wanted - used)
        extra = sorted(used - wanted)
        detail = []
        if extra:
            detail.append("uses " + ", ".join(f"${n}" for n in extra) + " but declares no name for it")
        if missing:
            detail.append("declares " + ", ".join(f"${n} ({params[n - 1]})" for n in missing) + " but never uses it")
        fail(f"{where}: " + "; ".join(detail) + f" (-- params: {', '.join(params) or 'none'})")


def descriptors(queries):
    """The statements' descriptors, and the texts of the variants that fill
    every placeholder: each is a statement of its own, added to the embedded
    queries after queries.sql's (its `source`), so that it is run as written
    and not as its query's text."""
    out = []
    filled = []
    names = {q.name for q in queries}
    for index, q in enumerate(queries):
        code = code_only(q.text)
        found = [(m.start(), m.end(), m.group(1)) for m in PLACEHOLDER.finditer(code)]
        chosen = None
        for vname, (extras, fills) in q.variants.items():
            if vname in names and vname != q.name:
                fail(f"query {q.name}: variant {vname} has the name of another query")
            if chosen is None:
                chosen = set(fills)
            elif set(fills) != chosen:
                fail(f"query {q.name}: its variants fill different placeholders")
        chosen = chosen or set()
        unknown = chosen - {f[2] for f in found}
        if unknown:
            fail(f"query {q.name}: a variant fills :{sorted(unknown)[0]}, which the query does not have")
        variants = q.variants.items() if q.variants else [(q.name, ([], {}))]
        for vname, (extras, fills) in variants:
            for p in extras:
                check_ident("queries.sql", f"parameter of {vname}", p)
            params = q.params + extras
            # The statement as the variant sends it, run-time placeholders
            # standing in for their (parameter-free) values.
            whole = q.text
            for start, end, placeholder in reversed(found):
                whole = whole[:start] + fills.get(placeholder, "NULL") + whole[end:]
            code_text = code_only(whole)
            where = f"query {q.name}" + (f", variant {vname}" if vname != q.name else "")
            check_params(where, code_text, params)
            stmts = statements(code_text)
            columns = result_columns(vname, stmts[0]) if len(stmts) == 1 else []
            # The text around the run-time placeholders, the variant's filled in.
            pieces, slots, current, cursor = [], [], "", 0
            for start, end, placeholder in found:
                current += q.text[cursor:start]
                cursor = end
                if placeholder in fills:
                    current += fills[placeholder]
                else:
                    pieces.append(current)
                    slots.append(placeholder)
                    current = ""
            pieces.append(current + q.text[cursor:])
            for s in slots:
                check_ident("queries.sql", f"placeholder of {vname}", s)
            if any(d.name == vname for d in out):
                fail(f"{where}: another query or variant is named {vname}")
            source_index = index
            if fills and not slots:
                source_index = len(queries) + len(filled)
                filled.append(Query(vname, pieces[0], params, {}))
            out.append(Descriptor(vname, source_index, params, columns, pieces, slots))
    return out, filled


# ---- output ------------------------------------------------------------------

def literal(text):
    if f"){DELIMITER}\"" in text:
        fail("SQL text contains the raw-string delimiter")
    return f'R"{DELIMITER}({text}){DELIMITER}"'


def string_array(names):
    inner = ", ".join(f'"{n}"' for n in names)
    return f"std::array<std::string_view, {len(names)}>{{{inner}}}"


def header(descs):
    out = ["// Generated by tools/embed_sql.py from src/pg/queries.sql. Do not edit.",
           "// One struct per statement: see pg/typed_query.hpp for how they are run.",
           "#pragma once", "", "#include <array>", "#include <cstddef>", "#include <string>",
           "#include <string_view>", "#include <tuple>", "", '#include "pg/fragment.hpp"', "",
           "namespace outboxd::pg::q {", ""]
    for d in descs:
        names = list(dict.fromkeys(d.slots))  # each placeholder once, in order
        out.append(f"// {d.name}: {len(d.params)} parameter(s), {len(d.columns)} column(s)"
                   + (f", filled in: {', '.join(names)}" if d.slots else "") + ".")
        out.append(f"struct {d.name} {{")
        out.append(f'    static constexpr std::string_view name = "{d.name}";')
        out.append(f"    static constexpr std::size_t source = {d.source};")
        out.append(f"    static constexpr auto params = {string_array(d.params)};")
        out.append(f"    static constexpr auto columns = {string_array(d.columns)};")
        out.append(f"    enum class col : int {{ {', '.join(d.columns)} }};")
        if d.params:
            out.append(f"    template <{', '.join(f'typename T{i}' for i in range(len(d.params)))}>")
            out.append("    struct args {")
            out.append(f"        using query_type = {d.name};")
            for i, p in enumerate(d.params):
                out.append(f"        T{i} {p};  // ${i + 1}")
            out.append(f"        [[nodiscard]] auto values() const {{ return std::tie({', '.join(d.params)}); }}")
            out.append("    };")
        if d.slots:
            out.append("    struct fills {")
            for s in names:
                out.append(f"        fragment {s};")
            out.append("    };")
            out.append("    // The statement for `schema` with the placeholders filled in.")
            out.append("    [[nodiscard]] static std::string text(std::string_view schema, const fills& f);")
        else:
            out.append("    // The statement for `schema`.")
            out.append("    [[nodiscard]] static std::string text(std::string_view schema);")
        out.append("};")
        out.append("")
    out.append("// Every statement, for tests that check them all against PostgreSQL.")
    out.append(f"using all = std::tuple<{', '.join(d.name for d in descs)}>;")
    out.append("")
    out += ["}  // namespace outboxd::pg::q", ""]
    return "\n".join(out)


def source(migrations, queries, descs):
    out = ["// Generated by tools/embed_sql.py from sql/ and src/pg/queries.sql. Do not edit.",
           '#include "core/embedded_sql.hpp"', '#include "core/sql_ident.hpp"', '#include "pg/queries.hpp"', "",
           "#include <array>", "", "namespace outboxd::embedded {", "namespace {", "",
           f"const std::array<migration_source, {len(migrations)}> migration_list{{{{"]
    for version, name, sql in migrations:
        out.append(f'    {{{version}, "{name}", {literal(sql)}}},')
    out += ["}};", "", f"const std::array<query_source, {len(queries)}> query_list{{{{"]
    for q in queries:
        out.append(f'    {{"{q.name}", {literal(q.text)}}},')
    out += ["}};", "", "}  // namespace", "",
            "std::span<const migration_source> migrations() noexcept { return migration_list; }",
            "std::span<const query_source> queries() noexcept { return query_list; }", "",
            "}  // namespace outboxd::embedded", "", "namespace outboxd::pg::q {", ""]
    for d in descs:
        if d.slots:
            out.append(f"std::string {d.name}::text(std::string_view schema, const fills& f) {{")
            out.append("    std::string sql;")
            # The schema goes into the text around the fills, never into
            # them: a fill is SQL of its own, quoted by whoever made it.
            for piece, slot in zip(d.pieces, d.slots):
                out.append(f"    sql += render_sql({literal(piece)}, schema);")
                out.append(f"    sql += f.{slot}.text;")
            out.append(f"    sql += render_sql({literal(d.pieces[-1])}, schema);")
            out.append("    return sql;")
        else:
            out.append(f"std::string {d.name}::text(std::string_view schema) {{")
            out.append(f"    return render_sql(embedded::queries()[source].sql, schema);")
        out.append("}")
        out.append("")
    out += ["}  // namespace outboxd::pg::q", ""]
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--header", required=True)
    parser.add_argument("--queries", required=True)
    parser.add_argument("--migrations", nargs="+", required=True)
    args = parser.parse_args()

    migrations = load_migrations(args.migrations)
    queries = load_queries(args.queries)
    descs, filled = descriptors(queries)
    pathlib.Path(args.output).write_text(source(migrations, queries + filled, descs), encoding="utf-8")
    pathlib.Path(args.header).write_text(header(descs), encoding="utf-8")


if __name__ == "__main__":
    main()
