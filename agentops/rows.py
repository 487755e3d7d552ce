"""Model rows read and written by hand-written statements, for the hot path of every turn.

The ORM builds each query anew, at several times the CPU of the statement itself, and a turn
makes a dozen statements (docs/performance.md, "Hand-written statements"), so the statements on
that path are written by hand and their rows turned into model instances here. The column lists
come from the models' own fields (cached per model), and values go through the fields' own
conversions both ways, so a field added to a model is read and written here as by the ORM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, TypeVar, cast

from django.db import connection, models, transaction

M = TypeVar("M", bound=models.Model)

Converter = Callable[[Any, Any, Any], Any]


@cache
def _fields(model: type[models.Model]) -> tuple[models.Field[Any, Any], ...]:
    return tuple(model._meta.concrete_fields)


@cache
def _attnames(model: type[models.Model]) -> tuple[str, ...]:
    return tuple(f.attname for f in _fields(model))


@cache
def _by_attname(model: type[models.Model]) -> dict[str, models.Field[Any, Any]]:
    return {f.attname: f for f in _fields(model)}


@cache
def _converters(model: type[models.Model]) -> tuple[tuple[int, Any, tuple[Converter, ...]], ...]:
    """Per column that needs any, the conversions the ORM applies to a value read (JSON, say)."""
    out = []
    for i, field in enumerate(_fields(model)):
        col = field.get_col(model._meta.db_table)
        found = tuple(connection.ops.get_db_converters(col)) + tuple(
            cast(Any, field).get_db_converters(connection)
        )
        if found:
            out.append((i, col, found))
    return tuple(out)


@cache
def columns(model: type[models.Model], alias: str) -> str:
    """The model's columns as a select list, in field order, qualified by ``alias``."""
    return ", ".join(f"{alias}.{connection.ops.quote_name(f.column)}" for f in _fields(model))


def width(model: type[models.Model]) -> int:
    """How many columns ``columns`` lists."""
    return len(_fields(model))


def instance(model: type[M], values: Sequence[Any]) -> M:
    """The model instance for one row's ``columns(model, ...)`` values, as the ORM would load it."""
    row = list(values)
    for i, col, converters in _converters(model):
        for convert in converters:
            row[i] = convert(row[i], col, connection)
    return model.from_db(connection.alias, _attnames(model), row)


def split(row: Sequence[Any], *models_: type[models.Model]) -> list[models.Model]:
    """One result row that selected ``columns`` of each of ``models_`` in turn, as instances."""
    out, at = [], 0
    for model in models_:
        out.append(instance(model, row[at : at + width(model)]))
        at += width(model)
    return out


def fetch(
    sql: str, params: Sequence[Any], *models_: type[models.Model]
) -> list[list[models.Model]]:
    """Run ``sql`` (selecting ``columns`` of each of ``models_`` in turn) and split each row."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [split(row, *models_) for row in cursor.fetchall()]


def instances(sql: str, params: Sequence[Any], model: type[M]) -> list[M]:
    """Run ``sql`` (selecting ``columns(model, ...)``): the rows as instances of ``model``."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [instance(model, row) for row in cursor.fetchall()]


def insert(obj: M, *, computed: dict[str, tuple[str, list[Any]]] | None = None) -> M:
    """Insert ``obj`` (a new instance) and set its primary key, as ``save()`` does. ``computed``
    gives columns by attname whose value is an SQL expression with its parameters (a sequence
    number, say): their values are read back onto ``obj``."""
    model = type(obj)
    computed = computed or {}
    pk = model._meta.pk
    assert pk is not None
    names, values, params = [], [], []
    for field in _fields(model):
        if field is pk and getattr(obj, field.attname) is None:
            continue
        names.append(connection.ops.quote_name(field.column))
        if field.attname in computed:
            expression, expression_params = computed[field.attname]
            values.append(expression)
            params.extend(expression_params)
        else:
            values.append("%s")
            params.append(field.get_db_prep_save(field.pre_save(obj, True), connection))
    back = [pk.attname, *computed]
    returning = ", ".join(
        connection.ops.quote_name(_by_attname(model)[name].column) for name in back
    )
    sql = (
        f"INSERT INTO {model._meta.db_table} ({', '.join(names)}) "
        f"VALUES ({', '.join(values)}) RETURNING {returning}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        got = cursor.fetchone()
    for name, value in zip(back, got, strict=True):
        setattr(obj, name, value)
    obj._state.adding = False
    obj._state.db = connection.alias
    return obj


def update(model: type[models.Model], pk: Any, **values: Any) -> int:
    """``UPDATE`` the row ``pk`` of ``model`` with ``values`` by attname (plain values, no
    expressions), converted as the ORM converts them; the number of rows changed."""
    fields = [_by_attname(model)[name] for name in values]
    sets = ", ".join(f"{connection.ops.quote_name(f.column)} = %s" for f in fields)
    params = [
        f.get_db_prep_save(v, connection) for f, v in zip(fields, values.values(), strict=True)
    ]
    pk_column = connection.ops.quote_name(model._meta.pk.column)  # type: ignore[union-attr]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {model._meta.db_table} SET {sets} WHERE {pk_column} = %s", [*params, pk]
        )
        return int(cursor.rowcount)


def after_commit(send: Callable[[], None]) -> None:
    """``send()`` once the current transaction commits; at once outside one (autocommit: what
    the caller wrote is committed). Never through the database: Django's ``on_commit`` outside a
    transaction connects to ask whether autocommit is on, and what follows a write must not fail
    for that while the database is down. (A run's ``call.ended``, sent right after it recorded
    the call, did: the run took it for its bookkeeping failing and ran the turn again, calling
    the provider twice.) For the live events and the drains a write hands on."""
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(send)
    else:
        send()
