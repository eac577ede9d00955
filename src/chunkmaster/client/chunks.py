"""RecordIO's chunk reader, under the name the client's callers knew it by: it lives in
chunkmaster.formats.recordio, beside the other formats' loaders."""

from chunkmaster.formats.recordio import (
    LARGE_RECORD,
    ChunkReader,
    LoadedChunk,
    cut_records,
    last_record,
)

__all__ = ["LARGE_RECORD", "ChunkReader", "LoadedChunk", "cut_records", "last_record"]
