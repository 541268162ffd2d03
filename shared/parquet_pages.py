"""What an untrusted Parquet file's pages declare, read before a single value is decoded.

pyarrow decodes as many values as a data page's own header declares, whatever the footer's
column metadata says: a few KB of run-length-encoded zeros can declare a list of 150 million
tokens (over a GB once decoded), and lowering the footer's ``num_values`` does not stop it. So
the sizes that bound decoding are read from every page header of every column chunk, with a
strict reader of Thrift's compact protocol that refuses anything malformed, deep or long.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow.parquet as pq

DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3
MAX_DEPTH = 16
"""Deepest struct nesting a page header may use (the format itself needs three)."""


class PageHeaderError(ValueError):
    """A page header that cannot be read; the message says where and why."""


@dataclass(frozen=True)
class ColumnPages:
    """What one column chunk's pages declare."""

    path: str
    values: int
    """Values in data and dictionary pages, as their headers declare (levels included for lists)."""
    uncompressed_bytes: int
    """Sum of the pages' uncompressed sizes (what decompression allocates)."""
    pages: int


class _Compact:
    """Reader of the Thrift compact protocol over ``data[pos:end]``; raises on anything outside it."""

    def __init__(self, data: bytes, pos: int, end: int) -> None:
        self.data, self.pos, self.end = data, pos, end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise PageHeaderError("page header runs past its column chunk")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def varint(self) -> int:
        value = 0
        for shift in range(0, 70, 7):
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
        raise PageHeaderError("varint longer than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip_bytes(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise PageHeaderError("page header field runs past its column chunk")
        self.pos += n

    def fields(self, depth: int) -> Iterator[tuple[int, int]]:
        """Yield (field id, type) of a struct until its stop byte; the caller reads or skips each value."""
        if depth > MAX_DEPTH:
            raise PageHeaderError(f"page header nests deeper than {MAX_DEPTH}")
        field = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            delta, kind = head >> 4, head & 0x0F
            field = field + delta if delta else self.zigzag()
            yield field, kind

    def skip(self, kind: int, depth: int) -> None:
        if kind in (1, 2):  # booleans live in the field header
            return
        if kind == 3:
            self.skip_bytes(1)
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.skip_bytes(8)
        elif kind == 8:
            self.skip_bytes(self.varint())
        elif kind in (9, 10):
            head = self.byte()
            size, element = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            self._skip_many(size, [element], depth)
        elif kind == 11:
            size = self.varint()
            if size:
                types = self.byte()
                self._skip_many(size, [types >> 4, types & 0x0F], depth)
        elif kind == 12:
            for _, inner in self.fields(depth + 1):
                self.skip(inner, depth + 1)
        else:
            raise PageHeaderError(f"unknown Thrift type {kind}")

    def _skip_many(self, size: int, kinds: list[int], depth: int) -> None:
        if size > self.end - self.pos:  # every element takes at least a byte
            raise PageHeaderError("container larger than its column chunk")
        for _ in range(size):
            for kind in kinds:
                if kind in (1, 2):
                    self.skip_bytes(1)  # inside containers a boolean takes a byte
                else:
                    self.skip(kind, depth + 1)


def _page(reader: _Compact) -> tuple[int, int, int, int]:
    """(page type, uncompressed size, compressed size, declared values) of the header at ``reader.pos``."""
    page_type = uncompressed = compressed = -1
    values = 0
    for field, kind in reader.fields(0):
        if field in (1, 2, 3) and kind == 5:
            value = reader.zigzag()
            if field == 1:
                page_type = value
            elif field == 2:
                uncompressed = value
            else:
                compressed = value
        elif field in (5, 7, 8) and kind == 12:  # data, dictionary, data v2 headers: num_values is field 1
            for inner, inner_kind in reader.fields(1):
                if inner == 1 and inner_kind == 5:
                    values = reader.zigzag()
                else:
                    reader.skip(inner_kind, 1)
        else:
            reader.skip(kind, 0)
    if min(page_type, uncompressed, compressed, values) < 0:
        raise PageHeaderError("page header lacks its type, sizes or value count, or one is negative")
    return page_type, uncompressed, compressed, values


def column_pages(data: bytes, metadata: pq.FileMetaData, max_pages: int = 100_000) -> list[ColumnPages]:
    """Every column chunk's declared pages, walked over the same bytes pyarrow reads."""
    out = []
    pages_seen = 0
    for group in range(metadata.num_row_groups):
        for column in range(metadata.num_columns):
            chunk = metadata.row_group(group).column(column)
            start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
            end = start + chunk.total_compressed_size
            if start < 0 or end > len(data):
                raise PageHeaderError(f"column {chunk.path_in_schema} lies outside the file")
            reader = _Compact(data, start, end)
            values = uncompressed = pages = 0
            while reader.pos < end:
                page_type, page_bytes, compressed, declared = _page(reader)
                reader.skip_bytes(compressed)
                pages += 1
                pages_seen += 1
                if pages_seen > max_pages:
                    raise PageHeaderError(f"more than {max_pages} pages")
                if page_type in (DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2):
                    values += declared
                uncompressed += page_bytes
            out.append(ColumnPages(chunk.path_in_schema, values, uncompressed, pages))
    return out
