/*
 * kstore._codec: the per-record work of kstore/records.py, in C.
 *
 * The pure-Python functions in kstore/records.py are the reference: the chapters show them and the
 * exercises plug into them. Each function here mirrors one of them and returns the same value for
 * every input the reference accepts:
 *
 *   validate_records(data, base_offset, records_count)        -> records.validate_records
 *   validate_batch(batch, crc32c)                             -> records.RecordBatch.validate
 *   decode_records(data, base_offset, base_timestamp,
 *                  log_append_time, base_sequence,
 *                  records_count, record_type)                -> records.decode_records
 *   decode_keys(data, base_offset, records_count)              -> records.decode_keys
 *   encode_records(records, offsets, base_offset,
 *                  base_timestamp)                             -> records.encode_records
 *   record_size_in_bytes(offset_delta, timestamp_delta,
 *                        key, value, headers)                  -> records.record_size_in_bytes
 *
 * Where the reference would raise (malformed or truncated bytes, a value out of range, an input
 * type it does not expect), the C function returns None instead and kstore/records.py re-runs the
 * reference, which raises its own exception with its own message. Errors are the rare path; this
 * keeps one source of truth for every message while the common path never builds per-field Python
 * objects it does not return. tests/test_native_codec.py checks both paths on the same inputs.
 *
 * Why it is fast: the records are walked in place in the caller's buffer (bytes, bytearray or a
 * memoryview of either, no copy), varints are decoded in registers, and a Record is filled through
 * its slots instead of a Python-level __init__ call.
 */
#define PY_SSIZE_T_CLEAN
#if defined(__GNUC__) && !defined(__clang__)
/* -O3 for this file (setup.py asks for -O2): GCC then inlines and unrolls the record walks;
 * measured here, validate_records of 100-byte records went from 8.2 to 5.0 ns a record. */
#pragma GCC optimize("O3")
#endif
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define MAX_VARINT_BYTES 5
#define MAX_VARLONG_BYTES 10
#define NO_SEQUENCE (-1)
#define INT32_MAX_V 2147483647LL

/* ------------------------------------------------------------------------------------------ */
/* varints (kstore/varint.py)                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* read_unsigned_varint: 0 and the value in *out, or -1 where the reference raises. */
static inline int
read_unsigned(const uint8_t *buf, Py_ssize_t len, Py_ssize_t *pos, int max_bytes, uint64_t *out)
{
    uint64_t result = 0;
    Py_ssize_t p = *pos;
    if (p < len && buf[p] < 0x80) {                  /* one byte: most lengths and deltas */
        *pos = p + 1;
        *out = buf[p];
        return 0;
    }
    for (int i = 0; i < max_bytes; i++) {
        if (p + i >= len)
            return -1;                               /* premature end of data */
        uint64_t b = buf[p + i];
        if (i == MAX_VARLONG_BYTES - 1 && (b & 0x7F) > 1)
            return -1;                               /* does not fit in 64 bits */
        result |= (b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            *pos = p + i + 1;
            *out = result;
            return 0;
        }
    }
    return -1;                                       /* longer than max_bytes */
}

static inline int
read_varint(const uint8_t *buf, Py_ssize_t len, Py_ssize_t *pos, int64_t *out)
{
    uint64_t z;
    if (read_unsigned(buf, len, pos, MAX_VARINT_BYTES, &z) < 0 || z > 0xFFFFFFFFULL)
        return -1;
    *out = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
    return 0;
}

static inline int
read_varlong(const uint8_t *buf, Py_ssize_t len, Py_ssize_t *pos, int64_t *out)
{
    uint64_t z;
    if (read_unsigned(buf, len, pos, MAX_VARLONG_BYTES, &z) < 0)
        return -1;
    *out = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
    return 0;
}

static inline int
size_of_unsigned(uint64_t u)
{
    int size = 1;
    while (u >= 0x80) {
        u >>= 7;
        size++;
    }
    return size;
}

static inline uint64_t zigzag32(int64_t n) { return (((uint64_t)n << 1) ^ (uint64_t)(n >> 31)) & 0xFFFFFFFFULL; }
static inline uint64_t zigzag64(int64_t n) { return ((uint64_t)n << 1) ^ (uint64_t)(n >> 63); }

static inline uint8_t *
write_unsigned(uint8_t *out, uint64_t u)
{
    while (u >= 0x80) {
        *out++ = (uint8_t)((u & 0x7F) | 0x80);
        u >>= 7;
    }
    *out++ = (uint8_t)u;
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* validate_records                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* The walk of records.validate_records: 1 = valid (null key seen in *null_key), 0 = the reference
 * raises. */
static int
walk_valid(const uint8_t *d, Py_ssize_t end_all, long long records_count, int *null_key)
{
    /* The next record starts where this one's size says (`pos = end`), not where the walk of
     * its fields got to (`q`, checked equal): so the CPU reads the next size while it is still
     * walking this record's fields, instead of one varint after another across the section. */
    Py_ssize_t pos = 0;
    int64_t v;
    *null_key = 0;
    for (long long i = 0; i < records_count; i++) {
        if (pos >= end_all)
            return 0;
        if (read_varint(d, end_all, &pos, &v) < 0)
            return 0;
        int64_t size = v;
        Py_ssize_t end = pos + size;
        if (size < 0 || end > end_all)
            return 0;
        Py_ssize_t q = pos + 1;                              /* attributes */
        if (read_varlong(d, end_all, &q, &v) < 0)            /* timestamp delta */
            return 0;
        if (read_varint(d, end_all, &q, &v) < 0 || v != i)   /* offset delta */
            return 0;
        for (int field = 0; field < 2; field++) {            /* key, value */
            if (read_varint(d, end_all, &q, &v) < 0)
                return 0;
            if (v < 0) {
                if (field == 0)
                    *null_key = 1;
            }
            else if (q + v > end)
                return 0;
            else
                q += v;
        }
        if (read_varint(d, end_all, &q, &v) < 0)
            return 0;
        int64_t n_headers = v;
        if (n_headers < 0 || n_headers > (int64_t)(end - q))
            return 0;
        for (int64_t h = 0; h < n_headers; h++) {
            if (read_varint(d, end_all, &q, &v) < 0 || v < 0)
                return 0;
            q += v;
            if (read_varint(d, end_all, &q, &v) < 0)
                return 0;
            if (v > 0)
                q += v;
            if (q > end)
                return 0;
        }
        if (q != end)
            return 0;
        pos = end;
    }
    return pos == end_all;
}

static PyObject *
codec_validate_records(PyObject *self, PyObject *args)
{
    Py_buffer data;
    long long base_offset, records_count;
    if (!PyArg_ParseTuple(args, "y*LL:validate_records", &data, &base_offset, &records_count))
        return NULL;
    int null_key = 0, ok;
    Py_BEGIN_ALLOW_THREADS
    ok = walk_valid((const uint8_t *)data.buf, data.len, records_count, &null_key);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (!ok)
        Py_RETURN_NONE;
    return Py_BuildValue("(LO)", records_count, null_key ? Py_True : Py_False);
}

/* ------------------------------------------------------------------------------------------ */
/* validate_batch                                                                             */
/* ------------------------------------------------------------------------------------------ */

/* The v2 batch header (records.py's offsets), for validate_batch and the cleaner's walks. */
#define BATCH_LOG_OVERHEAD 12                 /* baseOffset + batchLength */
#define BATCH_OVERHEAD 61                     /* RECORD_BATCH_OVERHEAD: the records start here */
#define BATCH_MIN_LENGTH 14                   /* MIN_BATCH_LENGTH_FIELD */
#define BATCH_ATTRIBUTES_OFFSET 21            /* the CRC covers attributes to the end */

/* An n-byte big-endian field. */
static inline uint64_t
load_be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* RecordBatch.validate: ensure_valid (size, CRC) then validate_records (the walk above) of one
 * uncompressed v2 batch, in one call; the CRC is computed by `crc32c`, the reference's own
 * function, over a read-only view of the batch. Returns the null-key flag, or None where the
 * reference raises or would decompress (then records.py runs the reference). */
static PyObject *
codec_validate_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "validate_batch(batch, crc32c) takes 2 arguments");
        return NULL;
    }
    Py_buffer data;
    if (PyObject_GetBuffer(args[0], &data, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint8_t *d = (const uint8_t *)data.buf;
    PyObject *result = Py_None;
    Py_INCREF(result);
    if (data.len < BATCH_OVERHEAD)
        goto done;
    int64_t size = BATCH_LOG_OVERHEAD + (int64_t)(int32_t)load_be(d + 8, 4);
    if (size < BATCH_OVERHEAD || data.len < size || d[16] != 2)
        goto done;                                  /* too small, truncated, not magic 2 */
    if (d[BATCH_ATTRIBUTES_OFFSET + 1] & 0x07)
        goto done;                                  /* compressed: the reference decompresses */
    PyObject *covered = PyMemoryView_FromMemory((char *)d + BATCH_ATTRIBUTES_OFFSET,
                                                size - BATCH_ATTRIBUTES_OFFSET, PyBUF_READ);
    if (covered == NULL)
        goto fail;
    PyObject *crc = PyObject_CallOneArg(args[1], covered);
    Py_DECREF(covered);
    if (crc == NULL)
        goto fail;
    unsigned long computed = PyLong_AsUnsignedLong(crc);
    Py_DECREF(crc);
    if (computed == (unsigned long)-1 && PyErr_Occurred())
        goto fail;
    if (computed != load_be(d + 17, 4))
        goto done;                                  /* the stored CRC does not match */
    long long records_count = (int32_t)load_be(d + 57, 4);
    int null_key = 0, ok;
    Py_BEGIN_ALLOW_THREADS
    ok = walk_valid(d + BATCH_OVERHEAD, size - BATCH_OVERHEAD, records_count,
                    &null_key);
    Py_END_ALLOW_THREADS
    if (ok) {
        Py_DECREF(result);
        result = null_key ? Py_True : Py_False;
        Py_INCREF(result);
    }
done:
    PyBuffer_Release(&data);
    return result;
fail:
    Py_DECREF(result);
    PyBuffer_Release(&data);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* decode_records                                                                             */
/* ------------------------------------------------------------------------------------------ */

static const char *FIELD_NAMES[6] = {"key", "value", "timestamp", "headers", "offset", "sequence"};

/* The six slot descriptors of a Record-like class, so a record is filled without calling its
 * Python __init__; 0 if the class has no such slots (then the class is called instead). */
static int
slot_setters(PyTypeObject *type, PyObject *setters[6])
{
    static PyObject *names[6];
    for (int i = 0; i < 6; i++) {
        if (names[i] == NULL && (names[i] = PyUnicode_InternFromString(FIELD_NAMES[i])) == NULL) {
            PyErr_Clear();
            return 0;
        }
        PyObject *d = _PyType_Lookup(type, names[i]);
        if (d == NULL || !PyObject_TypeCheck(d, &PyMemberDescr_Type))
            return 0;
        setters[i] = d;
    }
    return 1;
}

static PyObject *
new_record(PyTypeObject *type, PyObject *setters[6], int use_slots, PyObject *fields[6])
{
    if (!use_slots)
        return PyObject_Vectorcall((PyObject *)type, fields, 6, NULL);
    PyObject *obj = type->tp_alloc(type, 0);
    if (obj == NULL)
        return NULL;
    for (int i = 0; i < 6; i++) {
        if (Py_TYPE(setters[i])->tp_descr_set(setters[i], obj, fields[i]) < 0) {
            Py_DECREF(obj);
            return NULL;
        }
    }
    return obj;
}

/* A length-prefixed bytes field (records._read_bytes_field): 1 = read (new reference or None in
 * *out), 0 = the reference raises, -1 = a Python error. */
static int
bytes_field(const uint8_t *d, Py_ssize_t len, Py_ssize_t *pos, Py_ssize_t end, PyObject **out)
{
    int64_t n;
    if (read_varint(d, len, pos, &n) < 0)
        return 0;
    if (n < 0) {
        *out = Py_NewRef(Py_None);
        return 1;
    }
    if (*pos + n > end)
        return 0;
    *out = PyBytes_FromStringAndSize((const char *)d + *pos, (Py_ssize_t)n);
    if (*out == NULL)
        return -1;
    *pos += n;
    return 1;
}

/* The headers of one record as a tuple of (str, bytes | None); same result codes as bytes_field. */
static int
read_headers(const uint8_t *d, Py_ssize_t len, Py_ssize_t *pos, Py_ssize_t end, PyObject **out)
{
    int64_t n;
    if (read_varint(d, len, pos, &n) < 0 || n < 0 || n > (int64_t)(end - *pos))
        return 0;
    PyObject *headers = PyTuple_New((Py_ssize_t)n);
    if (headers == NULL)
        return -1;
    for (int64_t h = 0; h < n; h++) {
        int64_t klen;
        if (read_varint(d, len, pos, &klen) < 0 || klen < 0 || *pos + klen > end) {
            Py_DECREF(headers);
            return 0;
        }
        PyObject *key = PyUnicode_DecodeUTF8((const char *)d + *pos, (Py_ssize_t)klen, "replace");
        if (key == NULL) {
            Py_DECREF(headers);
            return -1;
        }
        *pos += klen;
        PyObject *value = NULL;
        int r = bytes_field(d, len, pos, end, &value);
        if (r <= 0) {
            Py_DECREF(key);
            Py_DECREF(headers);
            return r;
        }
        PyObject *pair = PyTuple_Pack(2, key, value);
        Py_DECREF(key);
        Py_DECREF(value);
        if (pair == NULL) {
            Py_DECREF(headers);
            return -1;
        }
        PyTuple_SET_ITEM(headers, (Py_ssize_t)h, pair);
    }
    *out = headers;
    return 1;
}

static inline int64_t
increment_sequence(int64_t sequence, int64_t increment)
{
    if (sequence > INT32_MAX_V - increment)
        return increment - (INT32_MAX_V - sequence) - 1;
    return sequence + increment;
}

/* Skip a length-prefixed bytes field, checking it as bytes_field does (1 = ok, 0 = reference raises). */
static int
skip_field(const uint8_t *d, Py_ssize_t len, Py_ssize_t *pos, Py_ssize_t end)
{
    int64_t n;
    if (read_varint(d, len, pos, &n) < 0 || (n >= 0 && *pos + n > end))
        return 0;
    if (n > 0)
        *pos += n;
    return 1;
}

typedef struct {
    long long base_offset, base_timestamp, log_append_time, base_sequence, records_count;
    int has_lat;
    PyTypeObject *type;          /* Record class; NULL = (offset, key) pairs (decode_keys) */
} DecodeArgs;

/* One record as a Record, or as an (offset, key) pair: 1 = *out set, 0 = the reference raises,
 * -1 = a Python error. */
static int
decode_one(const uint8_t *d, Py_ssize_t len, Py_ssize_t *pos, const DecodeArgs *a,
           PyObject *setters[6], int use_slots, PyObject **out)
{
    int64_t size, ts_delta, offset_delta, timestamp, offset;
    PyObject *f[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    int r = 0;
    if (read_varint(d, len, pos, &size) < 0)
        return 0;
    Py_ssize_t end = *pos + size;
    if (size < 0 || end > len)
        return 0;
    *pos += 1;                                               /* attributes */
    if (read_varlong(d, len, pos, &ts_delta) < 0 || read_varint(d, len, pos, &offset_delta) < 0)
        return 0;
    if ((r = bytes_field(d, len, pos, end, &f[0])) <= 0)
        goto failed;
    r = a->type ? bytes_field(d, len, pos, end, &f[1]) : skip_field(d, len, pos, end);
    if (r <= 0 || (r = read_headers(d, len, pos, end, &f[3])) <= 0)
        goto failed;
    r = 0;
    if (*pos != end || __builtin_add_overflow((int64_t)a->base_offset, offset_delta, &offset))
        goto failed;
    if (a->type == NULL) {                                   /* decode_keys */
        *out = Py_BuildValue("(LO)", (long long)offset, f[0]);
        r = *out ? 1 : -1;
        goto failed;                                         /* (releases the fields) */
    }
    if (a->has_lat)
        timestamp = a->log_append_time;
    else if (__builtin_add_overflow((int64_t)a->base_timestamp, ts_delta, &timestamp))
        goto failed;                                         /* the reference gives a big int */
    f[2] = PyLong_FromLongLong(timestamp);
    f[4] = PyLong_FromLongLong(offset);
    f[5] = PyLong_FromLongLong(a->base_sequence < 0 ? NO_SEQUENCE
                               : increment_sequence(a->base_sequence, offset_delta));
    if (f[2] == NULL || f[4] == NULL || f[5] == NULL) {
        r = -1;
        goto failed;
    }
    *out = new_record(a->type, setters, use_slots, f);
    r = *out ? 1 : -1;
failed:
    for (int k = 0; k < 6; k++)
        Py_XDECREF(f[k]);
    return r;
}

/* The loop of records.decode_records (and decode_keys): a list, or None where the reference raises. */
static PyObject *
decode_walk(Py_buffer *data, const DecodeArgs *a)
{
    PyObject *setters[6];
    int use_slots = a->type ? slot_setters(a->type, setters) : 0;
    const uint8_t *d = (const uint8_t *)data->buf;
    Py_ssize_t len = data->len, pos = 0;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (long long i = 0; i < a->records_count; i++) {
        PyObject *item = NULL;
        int r = pos >= len ? 0 : decode_one(d, len, &pos, a, setters, use_slots, &item);
        if (r == 1 && PyList_Append(out, item) < 0)
            r = -1;
        Py_XDECREF(item);
        if (r <= 0) {
            Py_DECREF(out);
            return r < 0 ? NULL : Py_NewRef(Py_None);
        }
    }
    if (pos != len) {
        Py_DECREF(out);
        return Py_NewRef(Py_None);
    }
    return out;
}

static PyObject *
codec_decode_records(PyObject *self, PyObject *args)
{
    Py_buffer data;
    DecodeArgs a = {0};
    PyObject *log_append_time_obj, *type_obj, *result = NULL;
    if (!PyArg_ParseTuple(args, "y*LLOLLO:decode_records", &data, &a.base_offset,
                          &a.base_timestamp, &log_append_time_obj, &a.base_sequence,
                          &a.records_count, &type_obj))
        return NULL;
    if (!PyType_Check(type_obj)) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a class");
        goto done;
    }
    a.type = (PyTypeObject *)type_obj;
    a.has_lat = log_append_time_obj != Py_None;
    if (a.has_lat) {
        a.log_append_time = PyLong_AsLongLong(log_append_time_obj);
        if (a.log_append_time == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            result = Py_NewRef(Py_None);             /* out of range: the reference handles it */
            goto done;
        }
    }
    result = decode_walk(&data, &a);
done:
    PyBuffer_Release(&data);
    return result;
}

/* The (offset, key) pairs of records.decode_keys: the same walk and checks as decode_records,
 * but neither values nor headers are returned. */
static PyObject *
codec_decode_keys(PyObject *self, PyObject *args)
{
    Py_buffer data;
    DecodeArgs a = {0};
    if (!PyArg_ParseTuple(args, "y*LL:decode_keys", &data, &a.base_offset, &a.records_count))
        return NULL;
    PyObject *result = decode_walk(&data, &a);
    PyBuffer_Release(&data);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* encode_records                                                                             */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    uint8_t *buf;
    Py_ssize_t len, cap;
} Out;

static int
out_reserve(Out *o, Py_ssize_t more)
{
    if (o->len + more <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more)
        cap *= 2;
    uint8_t *b = PyMem_Realloc(o->buf, (size_t)cap);
    if (b == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->buf = b;
    o->cap = cap;
    return 0;
}

/* Borrow the bytes of a key, value or header value: 1 = a buffer (or None: *is_null), 0 = a type
 * the reference treats differently (it gets the call). */
static int
field_bytes(PyObject *obj, const char **p, Py_ssize_t *n, int *is_null)
{
    *is_null = 0;
    if (obj == Py_None) {
        *is_null = 1;
        return 1;
    }
    if (PyBytes_CheckExact(obj)) {
        *p = PyBytes_AS_STRING(obj);
        *n = PyBytes_GET_SIZE(obj);
        return 1;
    }
    if (PyByteArray_CheckExact(obj)) {
        *p = PyByteArray_AS_STRING(obj);
        *n = PyByteArray_GET_SIZE(obj);
        return 1;
    }
    return 0;
}

static inline Py_ssize_t
size_of_field(int is_null, Py_ssize_t n)
{
    return is_null ? 1 : size_of_unsigned(zigzag32(n)) + n;
}

static inline uint8_t *
write_field(uint8_t *w, int is_null, const char *p, Py_ssize_t n)
{
    if (is_null) {
        *w++ = 0x01;                                 /* varint -1 */
        return w;
    }
    w = write_unsigned(w, zigzag32(n));
    memcpy(w, p, (size_t)n);
    return w + n;
}

#define MAX_FAST_HEADERS 64

typedef struct {
    const char *kp, *vp;
    Py_ssize_t kn, vn;
    int v_null;
} HeaderView;

/* Append one record (records.encode_record); 1 = done, 0 = the reference gets the call, -1 = error. */
static int
encode_one(Out *o, PyObject *rec, int64_t offset_delta, int64_t base_timestamp, PyObject **names)
{
    PyObject *key = NULL, *value = NULL, *ts = NULL, *headers = NULL;
    int result = 0;
    key = PyObject_GetAttr(rec, names[0]);
    value = key ? PyObject_GetAttr(rec, names[1]) : NULL;
    ts = value ? PyObject_GetAttr(rec, names[2]) : NULL;
    headers = ts ? PyObject_GetAttr(rec, names[3]) : NULL;
    if (headers == NULL) {
        result = -1;
        goto done;
    }
    if (offset_delta < INT32_MIN || offset_delta > INT32_MAX || !PyLong_CheckExact(ts))
        goto done;
    int overflow = 0;
    long long timestamp = PyLong_AsLongLongAndOverflow(ts, &overflow);
    int64_t ts_delta;
    if (overflow || __builtin_sub_overflow((int64_t)timestamp, base_timestamp, &ts_delta))
        goto done;
    const char *kp = NULL, *vp = NULL;
    Py_ssize_t kn = 0, vn = 0;
    int k_null, v_null;
    if (!field_bytes(key, &kp, &kn, &k_null) || !field_bytes(value, &vp, &vn, &v_null))
        goto done;
    if (!PyTuple_CheckExact(headers) && !PyList_CheckExact(headers))
        goto done;
    Py_ssize_t n_headers = PySequence_Fast_GET_SIZE(headers);
    if (n_headers > MAX_FAST_HEADERS)
        goto done;
    HeaderView hv[MAX_FAST_HEADERS];
    Py_ssize_t body = 1 + size_of_unsigned(zigzag64(ts_delta)) + size_of_unsigned(zigzag32(offset_delta))
                      + size_of_field(k_null, kn) + size_of_field(v_null, vn)
                      + size_of_unsigned(zigzag32(n_headers));
    for (Py_ssize_t h = 0; h < n_headers; h++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(headers, h);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2)
            goto done;
        PyObject *hk = PyTuple_GET_ITEM(pair, 0), *hval = PyTuple_GET_ITEM(pair, 1);
        int hk_null;
        if (PyUnicode_CheckExact(hk)) {
            hv[h].kp = PyUnicode_AsUTF8AndSize(hk, &hv[h].kn);
            if (hv[h].kp == NULL) {                  /* e.g. a lone surrogate: the reference raises */
                PyErr_Clear();
                goto done;
            }
        }
        else if (!field_bytes(hk, &hv[h].kp, &hv[h].kn, &hk_null) || hk_null)
            goto done;
        if (!field_bytes(hval, &hv[h].vp, &hv[h].vn, &hv[h].v_null))
            goto done;
        body += size_of_field(0, hv[h].kn) + size_of_field(hv[h].v_null, hv[h].vn);
    }
    if (kn > INT32_MAX || vn > INT32_MAX || body > INT32_MAX)
        goto done;
    if (out_reserve(o, body + MAX_VARINT_BYTES) < 0) {
        result = -1;
        goto done;
    }
    uint8_t *w = o->buf + o->len;
    w = write_unsigned(w, zigzag32(body));
    *w++ = 0;                                        /* attributes */
    w = write_unsigned(w, zigzag64(ts_delta));
    w = write_unsigned(w, zigzag32(offset_delta));
    w = write_field(w, k_null, kp, kn);
    w = write_field(w, v_null, vp, vn);
    w = write_unsigned(w, zigzag32(n_headers));
    for (Py_ssize_t h = 0; h < n_headers; h++) {
        w = write_field(w, 0, hv[h].kp, hv[h].kn);
        w = write_field(w, hv[h].v_null, hv[h].vp, hv[h].vn);
    }
    o->len = w - o->buf;
    result = 1;
done:
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(ts);
    Py_XDECREF(headers);
    return result;
}

static PyObject *
codec_encode_records(PyObject *self, PyObject *args)
{
    PyObject *records, *offsets;
    long long base_offset, base_timestamp;
    if (!PyArg_ParseTuple(args, "OOLL:encode_records", &records, &offsets, &base_offset,
                          &base_timestamp))
        return NULL;
    static PyObject *names[4];
    if (names[0] == NULL) {
        names[0] = PyUnicode_InternFromString("key");
        names[1] = PyUnicode_InternFromString("value");
        names[2] = PyUnicode_InternFromString("timestamp");
        names[3] = PyUnicode_InternFromString("headers");
    }
    if (!PyList_CheckExact(records) || (offsets != Py_None && !PyList_CheckExact(offsets)))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(records);
    if (offsets != Py_None && PyList_GET_SIZE(offsets) != n)
        Py_RETURN_NONE;
    Out o = {NULL, 0, 0};
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t delta;
        if (offsets == Py_None)
            delta = i;
        else {
            PyObject *off = PyList_GET_ITEM(offsets, i);
            int overflow = 0;
            long long v = PyLong_CheckExact(off) ? PyLong_AsLongLongAndOverflow(off, &overflow) : 0;
            if (!PyLong_CheckExact(off) || overflow
                    || __builtin_sub_overflow((int64_t)v, (int64_t)base_offset, &delta))
                goto fallback;
        }
        int r = encode_one(&o, PyList_GET_ITEM(records, i), delta, base_timestamp, names);
        if (r < 0)
            goto done;
        if (r == 0)
            goto fallback;
    }
    result = PyBytes_FromStringAndSize((const char *)o.buf, o.len);
    goto done;
fallback:
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(o.buf);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* record_lengths (issue 20, the Spark source's decoder: kstore/spark/decode.py ColumnBuilder._walk) */
/* ------------------------------------------------------------------------------------------ */

/* The bytes object a walk filled, or None (and the object freed) where the walk found something
 * the reference raises on. */
static PyObject *
filled_or_none(int ok, PyObject *out)
{
    if (ok)
        return out;
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* The walk itself: each record's zig-zag length varint into lengths[0..count); 1 when the
 * records fill d[0..len) exactly, 0 where the Python walk would raise or a length needs more
 * than 5 bytes or is negative. */
static int
walk_lengths(const uint8_t *d, Py_ssize_t len, long long count, int64_t *lengths)
{
    Py_ssize_t pos = 0;
    for (long long i = 0; i < count; i++) {
        uint64_t z;
        if (read_unsigned(d, len, &pos, MAX_VARINT_BYTES, &z) < 0 || z > 0xFFFFFFFFULL || (z & 1))
            return 0;
        lengths[i] = (int64_t)z;
        pos += (Py_ssize_t)(z >> 1);
        if (pos > len)
            return 0;
    }
    return pos == len;
}

/* The zig-zag length varint of each of `records_count` records laid back to back in `data`, as
 * native int64s in a bytes object (numpy reads it with frombuffer): the one step of the columnar
 * decoder that must go record by record. None where the Python walk would raise or where a
 * length needs more than 5 bytes or is negative (the Python walk then handles those records). */
static PyObject *
codec_record_lengths(PyObject *self, PyObject *args)
{
    Py_buffer data;
    long long count;
    if (!PyArg_ParseTuple(args, "y*L:record_lengths", &data, &count))
        return NULL;
    PyObject *out = NULL;
    if (count < 0 || count > data.len) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)count * 8);
    if (out == NULL)
        goto done;
    int ok;
    int64_t *lengths = (int64_t *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    ok = walk_lengths((const uint8_t *)data.buf, data.len, count, lengths);
    Py_END_ALLOW_THREADS
    out = filled_or_none(ok, out);
done:
    PyBuffer_Release(&data);
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* record_fields (the Spark source's decoder: kstore/spark/decode.py ColumnBuilder._fields)       */
/* ------------------------------------------------------------------------------------------ */

#define RECORD_FIELDS 8   /* ColumnBuilder.FIELDS: ts delta, offset delta, key start/length,
                             value start/length, headers position, end */

/* The fields of records laid back to back in `data`, given each record's zig-zag length (from
 * record_lengths), as 8 rows of n native int64s in a bytes object (numpy reshapes it). One pass
 * over the records instead of one numpy pass per field. None where the reference raises (a
 * negative or too short record, a field past its record's end) or a varint is malformed. */
static PyObject *
codec_record_fields(PyObject *self, PyObject *args)
{
    Py_buffer data, zz;
    if (!PyArg_ParseTuple(args, "y*y*:record_fields", &data, &zz))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = zz.len / 8;
    if (zz.len % 8) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, n * 8 * RECORD_FIELDS);
    if (out == NULL)
        goto done;
    int64_t *f = (int64_t *)PyBytes_AS_STRING(out);
    const uint8_t *d = (const uint8_t *)data.buf, *zp = (const uint8_t *)zz.buf;
    Py_ssize_t len = data.len, end = 0;
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        int64_t z, ts, delta, key_len, value_len;
        memcpy(&z, zp + 8 * i, 8);
        ok = 0;
        if (z < 0 || (z & 1))
            break;                                   /* a negative length */
        int64_t length = z >> 1;
        /* the reference's varint size of the length: 1 to 5 bytes, by value */
        Py_ssize_t size = 1 + (z >= 1LL << 7) + (z >= 1LL << 14) + (z >= 1LL << 21) + (z >= 1LL << 28);
        if (length < 6 || length > len - end - size)
            break;                                   /* too short, or past the data */
        Py_ssize_t start = end + size;
        end = start + (Py_ssize_t)length;
        /* Every field is read as a varlong bounded by the record's end: the reference's
         * whole-column `_varints` decodes each one the same way, up to 10 bytes. */
        Py_ssize_t q = start + 1;                    /* skip the attributes byte */
        if (read_varlong(d, end, &q, &ts) < 0 || read_varlong(d, end, &q, &delta) < 0
                || read_varlong(d, end, &q, &key_len) < 0 || key_len < -1
                || (key_len > 0 && key_len > end - q))
            break;
        Py_ssize_t key_start = q;
        q += key_len > 0 ? key_len : 0;
        if (read_varlong(d, end, &q, &value_len) < 0 || value_len < -1
                || (value_len > 0 && value_len >= end - q))
            break;                                   /* the header count must follow it */
        Py_ssize_t value_start = q;
        q += value_len > 0 ? value_len : 0;
        if (q >= end)
            break;
        f[i] = ts;
        f[n + i] = delta;
        f[2 * n + i] = key_start;
        f[3 * n + i] = key_len;
        f[4 * n + i] = value_start;
        f[5 * n + i] = value_len;
        f[6 * n + i] = q;
        f[7 * n + i] = end;
        ok = 1;
    }
    Py_END_ALLOW_THREADS
    out = filled_or_none(ok, out);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&zz);
    return out;
}

/* One int64 of a column given as a buffer of int64s (numpy arrays). */
static inline int64_t
int64_at(const Py_buffer *b, Py_ssize_t i)
{
    int64_t v;
    memcpy(&v, (const uint8_t *)b->buf + 8 * i, 8);
    return v;
}

/* ------------------------------------------------------------------------------------------ */
/* take_batches (the Spark source's decoder: kstore/spark/decode.py take_batches)             */
/* ------------------------------------------------------------------------------------------ */

#define TAKE_META 8       /* decode.BATCH_META: records, base offset, last offset delta,
                             base timestamp, max timestamp, attributes, position, size */

/* The CRC check of the batch at d[0..size) through the reference's own `crc32c`: 1 it matches,
 * 0 it does not, -1 an exception. */
static int
crc_matches(const uint8_t *d, int64_t size, PyObject *crc32c)
{
    PyObject *covered = PyMemoryView_FromMemory((char *)d + BATCH_ATTRIBUTES_OFFSET,
                                                size - BATCH_ATTRIBUTES_OFFSET, PyBUF_READ);
    if (covered == NULL)
        return -1;
    PyObject *crc = PyObject_CallOneArg(crc32c, covered);
    Py_DECREF(covered);
    if (crc == NULL)
        return -1;
    unsigned long computed = PyLong_AsUnsignedLong(crc);
    Py_DECREF(crc);
    if (computed == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    return computed == load_be(d + 17, 4);
}

/* decode.take_batches: the batches at positions[first:] of `buffer` that the columnar decoder
 * queues as they are, in one call instead of one Python call per batch. Returns (next index,
 * meta, lengths) as the reference does; next index == first where the batch there is not one
 * it takes (the caller's add_batch then decompresses it or raises its error). */
static PyObject *
codec_take_batches(PyObject *self, PyObject *args)
{
    Py_buffer data, positions;
    Py_ssize_t first;
    long long start, end, max_records;
    int check_crcs;
    PyObject *crc32c;
    if (!PyArg_ParseTuple(args, "y*y*nLLpOL:take_batches", &data, &positions, &first, &start,
                          &end, &check_crcs, &crc32c, &max_records))
        return NULL;
    PyObject *meta = NULL, *lengths = NULL, *result = NULL;
    const uint8_t *d = (const uint8_t *)data.buf;
    Py_ssize_t n_positions = positions.len / 8, i = first < 0 ? n_positions : first;
    /* Pass 1, headers only: which batches, how many records at most. */
    Py_ssize_t stop = i, batches = 0;
    int64_t records = 0;
    for (; stop < n_positions; stop++) {
        int64_t pos = int64_at(&positions, stop);
        if (pos < 0 || pos > data.len - BATCH_OVERHEAD)
            break;
        const uint8_t *b = d + pos;
        int64_t size = BATCH_LOG_OVERHEAD + (int64_t)(int32_t)load_be(b + 8, 4);
        if (size < BATCH_OVERHEAD || size > data.len - pos || b[16] != 2
                || (b[BATCH_ATTRIBUTES_OFFSET + 1] & 0x07))
            break;                        /* add_batch reads it: another magic, compressed... */
        int64_t count = (int32_t)load_be(b + 57, 4);
        int64_t base = (int64_t)load_be(b, 8), last_delta = (int32_t)load_be(b + 23, 4);
        int passed_over = (b[BATCH_ATTRIBUTES_OFFSET + 1] & 0x20) || count <= 0
                          || base + last_delta < start || base >= end;
        if (!passed_over) {
            if (count > size - BATCH_OVERHEAD)
                break;                    /* more records than bytes: add_batch raises */
            if (records > 0 && records + count > max_records)
                break;                    /* enough for now (at least one batch is taken) */
            records += count;
            batches++;
        }
    }
    meta = PyBytes_FromStringAndSize(NULL, batches * TAKE_META * 8);
    lengths = PyBytes_FromStringAndSize(NULL, records * 8);
    if (meta == NULL || lengths == NULL)
        goto done;
    int64_t *m = (int64_t *)PyBytes_AS_STRING(meta), *zz = (int64_t *)PyBytes_AS_STRING(lengths);
    Py_ssize_t taken = 0;
    int64_t records_taken = 0;
    /* Pass 2: the CRC and the walk; stops before a batch whose CRC or walk fails. */
    for (; i < stop; i++) {
        const uint8_t *b = d + int64_at(&positions, i);
        int64_t size = BATCH_LOG_OVERHEAD + (int64_t)(int32_t)load_be(b + 8, 4);
        if (check_crcs) {
            int matches = crc_matches(b, size, crc32c);
            if (matches < 0)
                goto done;
            if (!matches)
                break;
        }
        int64_t count = (int32_t)load_be(b + 57, 4);
        int64_t base = (int64_t)load_be(b, 8), last_delta = (int32_t)load_be(b + 23, 4);
        uint64_t attributes = load_be(b + BATCH_ATTRIBUTES_OFFSET, 2);
        if ((attributes & 0x20) || count <= 0 || base + last_delta < start || base >= end)
            continue;                     /* a marker, emptied, or outside [start, end) */
        int64_t section = size - BATCH_OVERHEAD;
        if (!walk_lengths(b + BATCH_OVERHEAD, section, count, zz + records_taken))
            break;
        int64_t *row = m + TAKE_META * taken;
        row[0] = count;
        row[1] = base;
        row[2] = last_delta;
        row[3] = (int64_t)load_be(b + 27, 8);
        row[4] = (int64_t)load_be(b + 35, 8);
        row[5] = (int16_t)attributes;                 /* signed, as struct reads it */
        row[6] = (int64_t)(b - d);                     /* where the batch is in `buffer` */
        row[7] = size;
        taken++;
        records_taken += count;
    }
    if (taken < batches) {                /* stopped early: only what was filled */
        if (_PyBytes_Resize(&meta, taken * TAKE_META * 8) < 0
                || _PyBytes_Resize(&lengths, records_taken * 8) < 0)
            goto done;
    }
    result = Py_BuildValue("(nOO)", i, meta, lengths);
done:
    Py_XDECREF(meta);
    Py_XDECREF(lengths);
    PyBuffer_Release(&data);
    PyBuffer_Release(&positions);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* records_section (issue 20: the Spark sink encodes Arrow columns)                           */
/* ------------------------------------------------------------------------------------------ */

/* The body size of record i (everything after its length varint), or -1 where a key or value
 * lies outside its data buffer or has a length below -1 (null). */
static inline int64_t
section_body_size(Py_ssize_t i, const Py_buffer *kd, const Py_buffer *ks, const Py_buffer *kl,
                  const Py_buffer *vd, const Py_buffer *vs, const Py_buffer *vl)
{
    int64_t size = 3 + size_of_unsigned(zigzag64(i));   /* attributes, ts delta, header count */
    const Py_buffer *data[2] = {kd, vd}, *starts[2] = {ks, vs}, *lengths[2] = {kl, vl};
    for (int c = 0; c < 2; c++) {
        int64_t length = int64_at(lengths[c], i), start = int64_at(starts[c], i);
        if (length < -1)
            return -1;
        if (length >= 0 && (start < 0 || start > data[c]->len - length))
            return -1;
        size += size_of_unsigned(zigzag64(length)) + (length > 0 ? length : 0);
    }
    return size;
}

/* encode.records_section(keys, values, headroom) from the columns' parts: each Arrow data
 * buffer, and per record the start of its key / value there and its length (-1: null). The same
 * bytes as the numpy reference, or None where a start or length is outside its buffer (or for no
 * records). With headroom > 0: a bytearray whose first `headroom` bytes are zeros (where the
 * caller writes the batch header, so the records are never copied behind it). */
static PyObject *
codec_records_section(PyObject *self, PyObject *args)
{
    Py_buffer kd, ks, kl, vd, vs, vl;
    Py_ssize_t headroom = 0;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*|n:records_section", &kd, &ks, &kl, &vd, &vs, &vl,
                          &headroom))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = kl.len / 8;
    /* no records: left to the reference (its trailing header-count piece makes it one byte) */
    int ok = n > 0 && ks.len == kl.len && vs.len == kl.len && vl.len == kl.len && kl.len % 8 == 0
             && headroom >= 0 && headroom <= 4096;
    int64_t total = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t body = section_body_size(i, &kd, &ks, &kl, &vd, &vs, &vl);
            if (body < 0) {
                ok = 0;
                break;
            }
            total += size_of_unsigned(zigzag64(body)) + body;
        }
        Py_END_ALLOW_THREADS
    }
    if (!ok) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    uint8_t *w;
    if (headroom > 0) {
        out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total + headroom);
        if (out == NULL)
            goto done;
        w = (uint8_t *)PyByteArray_AS_STRING(out);
        memset(w, 0, (size_t)headroom);
        w += headroom;
    } else {
        out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
        if (out == NULL)
            goto done;
        w = (uint8_t *)PyBytes_AS_STRING(out);
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        w = write_unsigned(w, zigzag64(section_body_size(i, &kd, &ks, &kl, &vd, &vs, &vl)));
        *w++ = 0;                                     /* attributes */
        *w++ = 0;                                     /* timestamp delta: the batch's time */
        w = write_unsigned(w, zigzag64(i));           /* offset delta */
        const Py_buffer *data[2] = {&kd, &vd}, *starts[2] = {&ks, &vs}, *lengths[2] = {&kl, &vl};
        for (int c = 0; c < 2; c++) {                 /* key, then value */
            int64_t length = int64_at(lengths[c], i);
            w = write_unsigned(w, zigzag64(length));
            if (length > 0) {
                memcpy(w, (const uint8_t *)data[c]->buf + int64_at(starts[c], i), (size_t)length);
                w += length;
            }
        }
        *w++ = 0;                                     /* header count */
    }
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&kd);
    PyBuffer_Release(&ks);
    PyBuffer_Release(&kl);
    PyBuffer_Release(&vd);
    PyBuffer_Release(&vs);
    PyBuffer_Release(&vl);
    return out;
}

/* Kafka's Utils.murmur2 with its seed, as kstore.partitioner.murmur2 computes it. */
static int32_t
murmur2(const uint8_t *d, Py_ssize_t length)
{
    const uint32_t m = 0x5bd1e995;
    uint32_t h = 0x9747b28cU ^ (uint32_t)length;
    Py_ssize_t length4 = length / 4;
    for (Py_ssize_t i = 0; i < length4; i++) {
        const uint8_t *p = d + 4 * i;
        uint32_t k = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16)
                     | ((uint32_t)p[3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    Py_ssize_t tail = length & ~(Py_ssize_t)3;
    switch (length % 4) {
    case 3:
        h ^= (uint32_t)d[tail + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)d[tail + 1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)d[tail];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)h;
}

/* kstore.partitioner.partition_for_key for a column of keys: each key's start in `data` and its
 * length (-1: a null key, which gets -1). bytes of int64 partitions, or None where the reference
 * raises (no partitions) or a key lies outside the buffer. */
static PyObject *
codec_partitions_for_keys(PyObject *self, PyObject *args)
{
    Py_buffer data, starts, lengths;
    long long num_partitions;
    if (!PyArg_ParseTuple(args, "y*y*y*L:partitions_for_keys", &data, &starts, &lengths,
                          &num_partitions))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t n = lengths.len / 8;
    int ok = num_partitions >= 1 && starts.len == lengths.len && lengths.len % 8 == 0;
    if (!ok) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (out == NULL)
        goto done;
    int64_t *partitions = (int64_t *)PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t length = int64_at(&lengths, i), start = int64_at(&starts, i);
        if (length < 0) {
            partitions[i] = -1;                       /* a null key: the sticky partitioner's */
            continue;
        }
        if (start < 0 || start > data.len - length) {
            ok = 0;
            break;
        }
        int32_t h = murmur2((const uint8_t *)data.buf + start, (Py_ssize_t)length);
        partitions[i] = (int64_t)((uint32_t)h & 0x7fffffffU) % num_partitions;  /* toPositive */
    }
    Py_END_ALLOW_THREADS
    out = filled_or_none(ok, out);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* record_size_in_bytes (issue 17b: the producer sizes every record it batches)               */
/* ------------------------------------------------------------------------------------------ */

/* records._length_size: the varint size of a length n >= 0 (zig-zag doubles it, unmasked). */
static inline Py_ssize_t
length_size(Py_ssize_t n)
{
    return size_of_unsigned((uint64_t)n << 1);
}

/* The size a length-prefixed field adds, or -1 for a type the reference treats otherwise. */
static inline Py_ssize_t
field_size(PyObject *obj)
{
    const char *p;
    Py_ssize_t n;
    int is_null;
    if (!field_bytes(obj, &p, &n, &is_null))
        return -1;
    return is_null ? 1 : length_size(n) + n;
}

/* records.record_size_in_bytes(offset_delta, timestamp_delta, key, value, headers) -> int, or
 * None where the reference raises or takes types other than bytes/bytearray/str/None. */
static PyObject *
codec_record_size_in_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "record_size_in_bytes takes 5 arguments");
        return NULL;
    }
    int overflow = 0;
    long long offset_delta = PyLong_CheckExact(args[0])
        ? PyLong_AsLongLongAndOverflow(args[0], &overflow) : 0;
    if (!PyLong_CheckExact(args[0]) || overflow)
        Py_RETURN_NONE;
    long long ts_delta = PyLong_CheckExact(args[1])
        ? PyLong_AsLongLongAndOverflow(args[1], &overflow) : 0;
    if (!PyLong_CheckExact(args[1]) || overflow)
        Py_RETURN_NONE;
    Py_ssize_t key = field_size(args[2]), value = field_size(args[3]);
    PyObject *headers = args[4];
    if (key < 0 || value < 0 || (!PyTuple_CheckExact(headers) && !PyList_CheckExact(headers)))
        Py_RETURN_NONE;
    Py_ssize_t n_headers = PySequence_Fast_GET_SIZE(headers);
    Py_ssize_t size = 1 + size_of_unsigned(zigzag64(ts_delta)) + size_of_unsigned(zigzag32(offset_delta))
                      + key + value + length_size(n_headers);
    for (Py_ssize_t h = 0; h < n_headers; h++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(headers, h);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2)
            Py_RETURN_NONE;
        PyObject *hk = PyTuple_GET_ITEM(pair, 0);
        Py_ssize_t hk_size, hv_size = field_size(PyTuple_GET_ITEM(pair, 1));
        if (PyUnicode_CheckExact(hk)) {
            Py_ssize_t n;
            if (PyUnicode_AsUTF8AndSize(hk, &n) == NULL) {   /* a lone surrogate: the reference raises */
                PyErr_Clear();
                Py_RETURN_NONE;
            }
            hk_size = length_size(n) + n;
        }
        else
            hk_size = hk == Py_None ? -1 : field_size(hk);
        if (hk_size < 0 || hv_size < 0)
            Py_RETURN_NONE;
        size += hk_size + hv_size;
    }
    return PyLong_FromSsize_t(length_size(size) + size);
}

/* ------------------------------------------------------------------------------------------ */

static PyObject *codec_map_keys(PyObject *self, PyObject *args);
static PyObject *codec_filter_records(PyObject *self, PyObject *args);
static PyObject *codec_md5(PyObject *self, PyObject *args);
static PyObject *codec_offset_table(PyObject *self, PyObject *noargs);
static PyObject *codec_map_batches(PyObject *self, PyObject *args);
static PyObject *codec_filter_batches(PyObject *self, PyObject *args);
static PyObject *codec_skip_batches(PyObject *self, PyObject *args);

static PyMethodDef codec_methods[] = {
    {"validate_records", codec_validate_records, METH_VARARGS,
     "validate_records(data, base_offset, records_count) -> (count, null_key) or None.\n"
     "Mirrors kstore.records.validate_records; None where the reference raises."},
    {"validate_batch", (PyCFunction)(void (*)(void))codec_validate_batch, METH_FASTCALL,
     "validate_batch(batch, crc32c) -> null_key bool or None.\n"
     "Mirrors kstore.records.RecordBatch.validate (ensure_valid, then validate_records) for an "
     "uncompressed batch; None where the reference raises or decompresses."},
    {"decode_records", codec_decode_records, METH_VARARGS,
     "decode_records(data, base_offset, base_timestamp, log_append_time, base_sequence, "
     "records_count, record_type) -> list or None.\n"
     "Mirrors kstore.records.decode_records; None where the reference raises."},
    {"decode_keys", codec_decode_keys, METH_VARARGS,
     "decode_keys(data, base_offset, records_count) -> list of (offset, key) or None.\n"
     "Mirrors kstore.records.decode_keys; None where the reference raises."},
    {"encode_records", codec_encode_records, METH_VARARGS,
     "encode_records(records, offsets, base_offset, base_timestamp) -> bytes or None.\n"
     "Mirrors kstore.records.encode_records; None where the reference raises or takes other types."},
    {"record_lengths", codec_record_lengths, METH_VARARGS,
     "record_lengths(data, records_count) -> bytes of int64 zig-zag record lengths, or None.\n"
     "The record walk of kstore.spark.decode.ColumnBuilder._walk (issue 20)."},
    {"record_fields", codec_record_fields, METH_VARARGS,
     "record_fields(data, zigzag_lengths) -> bytes of 8 rows of int64 record fields, or None.\n"
     "Mirrors kstore.spark.decode.ColumnBuilder._fields; None where the reference raises."},
    {"take_batches", codec_take_batches, METH_VARARGS,
     "take_batches(buffer, positions, first, start, end, check_crcs, crc32c, max_records) -> "
     "(next index, meta, lengths).\n"
     "Mirrors kstore.spark.decode.take_batches: many batches queued in one call (issue 20)."},
    {"records_section", codec_records_section, METH_VARARGS,
     "records_section(key_data, key_starts, key_lengths, value_data, value_starts, value_lengths, "
     "headroom=0)"
     " -> bytes (a bytearray with headroom > 0) or None.\n"
     "Mirrors kstore.spark.encode.records_section; None where a key or value lies outside its "
     "buffer."},
    {"partitions_for_keys", codec_partitions_for_keys, METH_VARARGS,
     "partitions_for_keys(data, starts, lengths, num_partitions) -> bytes of int64 or None.\n"
     "Mirrors kstore.partitioner.partition_for_key over a column of keys (-1 for a null key)."},
    {"record_size_in_bytes", (PyCFunction)(void (*)(void))codec_record_size_in_bytes, METH_FASTCALL,
     "record_size_in_bytes(offset_delta, timestamp_delta, key, value, headers) -> int or None.\n"
     "Mirrors kstore.records.record_size_in_bytes; None where the reference raises or takes other types."},
    {"map_keys", codec_map_keys, METH_VARARGS,
     "map_keys(data, base_offset, records_count, start, entries, max_entries) -> "
     "(records read, map full, latest offset put or -1) or None.\n"
     "Mirrors kstore.offset_map.map_keys; None where the reference raises."},
    {"filter_records", codec_filter_records, METH_VARARGS,
     "filter_records(data, base_offset, records_count, entries, map_latest_offset, "
     "batch_delete_horizon, now) -> (kept indexes, invalid, tombstones dropped, tombstones kept) "
     "or None.\nMirrors kstore.cleaner.filter_records; None where the reference raises."},
    {"md5", codec_md5, METH_VARARGS, "md5(data) -> the 16-byte MD5 digest (SkimpyOffsetMap.hash_key)."},
    {"offset_table", codec_offset_table, METH_NOARGS,
     "offset_table() -> an empty OffsetTable (SkimpyOffsetMap.entries where the native codec runs)."},
    {"map_batches", codec_map_batches, METH_VARARGS,
     "map_batches(buffer, pos, start, stop_offset, table, max_entries, map_latest) -> "
     "(pos, status 0 go on / 1 stop offset reached / 2 map full, records read, map latest).\n"
     "Cleaner._map_segment's loop over the plain batches of a read buffer."},
    {"filter_batches", codec_filter_batches, METH_VARARGS,
     "filter_batches(buffer, pos, table, map_latest, now, upper_bound, producers) -> (pos, kept "
     "[(begin, end, last offset, max timestamp)], records read, records written, invalid, "
     "tombstones dropped, bytes read).\nCleaner._clean_into's loop over the plain batches of a "
     "read buffer that are dropped or kept whole."},
    {"skip_batches", codec_skip_batches, METH_VARARGS,
     "skip_batches(table, segment, position, map_latest, now, upper_bound, producers) -> "
     "(position, records read, invalid, tombstones dropped, bytes read).\nThe batches from "
     "`position` that map_batches summarized and the filter pass drops whole, passed over unread."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef codec_module = {
    PyModuleDef_HEAD_INIT, "kstore._codec",
    "The native record codec: kstore/records.py's per-record work in C (see kstore/native.py).",
    -1, codec_methods,
};

PyMODINIT_FUNC
PyInit__codec(void)
{
    return PyModule_Create(&codec_module);
}

/* ------------------------------------------------------------------------------------------ */
/* The cleaner's two passes (kstore/cleaner.py, kstore/offset_map.py)                         */
/* ------------------------------------------------------------------------------------------ */
/*
 *   map_keys(data, base_offset, records_count, start,
 *            entries, max_entries)                  -> offset_map.map_keys
 *   filter_records(data, base_offset, records_count,
 *                  entries, map_latest_offset,
 *                  batch_delete_horizon, now)       -> cleaner.filter_records
 *   md5(data)                                       -> hashlib.md5(data).digest()
 *
 * `entries` is the SkimpyOffsetMap's dict: MD5 digest of a key -> the latest offset of that key.
 * Both walk the records section once in place (no Record objects) with the checks of
 * records.decode_records, and return None where the reference would raise.
 */

/* MD5 (RFC 1321): the key hash of Kafka's SkimpyOffsetMap, computed here without a Python call.
 * The 64 steps are unrolled (constants K[i] = floor(|sin(i + 1)| * 2^32)): one step per line. */
#define MD5_F(x, y, z) (((x) & (y)) | (~(x) & (z)))
#define MD5_G(x, y, z) (((x) & (z)) | ((y) & ~(z)))
#define MD5_H(x, y, z) ((x) ^ (y) ^ (z))
#define MD5_I(x, y, z) ((y) ^ ((x) | ~(z)))
#define MD5_STEP(f, a, b, c, d, x, k, s) do { \
        (a) += MD5_##f((b), (c), (d)) + (x) + (k); \
        (a) = (((a) << (s)) | ((a) >> (32 - (s)))) + (b); \
    } while (0)

/* The 64 steps, one per line; a, b, c, d and w[16] are uint32_t (md5_block) or vectors (md5_lanes). */
#define MD5_64_STEPS(a, b, c, d, w) do { \
        MD5_STEP(F, a, b, c, d, w[0], 0xd76aa478U, 7); \
        MD5_STEP(F, d, a, b, c, w[1], 0xe8c7b756U, 12); \
        MD5_STEP(F, c, d, a, b, w[2], 0x242070dbU, 17); \
        MD5_STEP(F, b, c, d, a, w[3], 0xc1bdceeeU, 22); \
        MD5_STEP(F, a, b, c, d, w[4], 0xf57c0fafU, 7); \
        MD5_STEP(F, d, a, b, c, w[5], 0x4787c62aU, 12); \
        MD5_STEP(F, c, d, a, b, w[6], 0xa8304613U, 17); \
        MD5_STEP(F, b, c, d, a, w[7], 0xfd469501U, 22); \
        MD5_STEP(F, a, b, c, d, w[8], 0x698098d8U, 7); \
        MD5_STEP(F, d, a, b, c, w[9], 0x8b44f7afU, 12); \
        MD5_STEP(F, c, d, a, b, w[10], 0xffff5bb1U, 17); \
        MD5_STEP(F, b, c, d, a, w[11], 0x895cd7beU, 22); \
        MD5_STEP(F, a, b, c, d, w[12], 0x6b901122U, 7); \
        MD5_STEP(F, d, a, b, c, w[13], 0xfd987193U, 12); \
        MD5_STEP(F, c, d, a, b, w[14], 0xa679438eU, 17); \
        MD5_STEP(F, b, c, d, a, w[15], 0x49b40821U, 22); \
        MD5_STEP(G, a, b, c, d, w[1], 0xf61e2562U, 5); \
        MD5_STEP(G, d, a, b, c, w[6], 0xc040b340U, 9); \
        MD5_STEP(G, c, d, a, b, w[11], 0x265e5a51U, 14); \
        MD5_STEP(G, b, c, d, a, w[0], 0xe9b6c7aaU, 20); \
        MD5_STEP(G, a, b, c, d, w[5], 0xd62f105dU, 5); \
        MD5_STEP(G, d, a, b, c, w[10], 0x02441453U, 9); \
        MD5_STEP(G, c, d, a, b, w[15], 0xd8a1e681U, 14); \
        MD5_STEP(G, b, c, d, a, w[4], 0xe7d3fbc8U, 20); \
        MD5_STEP(G, a, b, c, d, w[9], 0x21e1cde6U, 5); \
        MD5_STEP(G, d, a, b, c, w[14], 0xc33707d6U, 9); \
        MD5_STEP(G, c, d, a, b, w[3], 0xf4d50d87U, 14); \
        MD5_STEP(G, b, c, d, a, w[8], 0x455a14edU, 20); \
        MD5_STEP(G, a, b, c, d, w[13], 0xa9e3e905U, 5); \
        MD5_STEP(G, d, a, b, c, w[2], 0xfcefa3f8U, 9); \
        MD5_STEP(G, c, d, a, b, w[7], 0x676f02d9U, 14); \
        MD5_STEP(G, b, c, d, a, w[12], 0x8d2a4c8aU, 20); \
        MD5_STEP(H, a, b, c, d, w[5], 0xfffa3942U, 4); \
        MD5_STEP(H, d, a, b, c, w[8], 0x8771f681U, 11); \
        MD5_STEP(H, c, d, a, b, w[11], 0x6d9d6122U, 16); \
        MD5_STEP(H, b, c, d, a, w[14], 0xfde5380cU, 23); \
        MD5_STEP(H, a, b, c, d, w[1], 0xa4beea44U, 4); \
        MD5_STEP(H, d, a, b, c, w[4], 0x4bdecfa9U, 11); \
        MD5_STEP(H, c, d, a, b, w[7], 0xf6bb4b60U, 16); \
        MD5_STEP(H, b, c, d, a, w[10], 0xbebfbc70U, 23); \
        MD5_STEP(H, a, b, c, d, w[13], 0x289b7ec6U, 4); \
        MD5_STEP(H, d, a, b, c, w[0], 0xeaa127faU, 11); \
        MD5_STEP(H, c, d, a, b, w[3], 0xd4ef3085U, 16); \
        MD5_STEP(H, b, c, d, a, w[6], 0x04881d05U, 23); \
        MD5_STEP(H, a, b, c, d, w[9], 0xd9d4d039U, 4); \
        MD5_STEP(H, d, a, b, c, w[12], 0xe6db99e5U, 11); \
        MD5_STEP(H, c, d, a, b, w[15], 0x1fa27cf8U, 16); \
        MD5_STEP(H, b, c, d, a, w[2], 0xc4ac5665U, 23); \
        MD5_STEP(I, a, b, c, d, w[0], 0xf4292244U, 6); \
        MD5_STEP(I, d, a, b, c, w[7], 0x432aff97U, 10); \
        MD5_STEP(I, c, d, a, b, w[14], 0xab9423a7U, 15); \
        MD5_STEP(I, b, c, d, a, w[5], 0xfc93a039U, 21); \
        MD5_STEP(I, a, b, c, d, w[12], 0x655b59c3U, 6); \
        MD5_STEP(I, d, a, b, c, w[3], 0x8f0ccc92U, 10); \
        MD5_STEP(I, c, d, a, b, w[10], 0xffeff47dU, 15); \
        MD5_STEP(I, b, c, d, a, w[1], 0x85845dd1U, 21); \
        MD5_STEP(I, a, b, c, d, w[8], 0x6fa87e4fU, 6); \
        MD5_STEP(I, d, a, b, c, w[15], 0xfe2ce6e0U, 10); \
        MD5_STEP(I, c, d, a, b, w[6], 0xa3014314U, 15); \
        MD5_STEP(I, b, c, d, a, w[13], 0x4e0811a1U, 21); \
        MD5_STEP(I, a, b, c, d, w[4], 0xf7537e82U, 6); \
        MD5_STEP(I, d, a, b, c, w[11], 0xbd3af235U, 10); \
        MD5_STEP(I, c, d, a, b, w[2], 0x2ad7d2bbU, 15); \
        MD5_STEP(I, b, c, d, a, w[9], 0xeb86d391U, 21); \
    } while (0)

/* MD5 reads its block as little-endian 32-bit words. */
static inline uint32_t
load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void
md5_block(uint32_t h[4], const uint8_t *block)
{
    uint32_t w[16];
    for (int i = 0; i < 16; i++)
        w[i] = load_le32(block + 4 * i);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
    MD5_64_STEPS(a, b, c, d, w);
    h[0] += a; h[1] += b; h[2] += c; h[3] += d;
}

static void
md5_digest(const uint8_t *p, Py_ssize_t n, uint8_t out[16])
{
    uint32_t h[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
    Py_ssize_t done = 0;
    for (; n - done >= 64; done += 64)
        md5_block(h, p + done);
    uint8_t tail[128] = {0};
    Py_ssize_t rest = n - done;
    memcpy(tail, p + done, (size_t)rest);
    tail[rest] = 0x80;
    Py_ssize_t tail_len = rest + 9 <= 64 ? 64 : 128;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++)
        tail[tail_len - 8 + i] = (uint8_t)(bits >> (8 * i));
    md5_block(h, tail);
    if (tail_len == 128)
        md5_block(h, tail + 64);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            out[4 * i + j] = (uint8_t)(h[i] >> (8 * j));
}

/* Sixteen keys of up to 55 bytes at once (each one padded block): the same 64 steps on 16-lane
 * vectors (GCC/Clang vector extensions: SIMD where the target has it, plain code elsewhere). The
 * cleaner hashes every key of a batch, so the lanes are always full but for the last group. */
#define MD5_LANES 16
#define MD5_ONE_BLOCK_MAX 55
typedef uint32_t md5_vec __attribute__((vector_size(4 * MD5_LANES)));

/* Built for AVX-512 and AVX2 as well where GCC can pick one at load time (x86-64 Linux): with
 * AVX-512 the 16 lanes fit one register and a rotate is one instruction. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) \
        && defined(__GLIBC__)
#define MD5_TARGETS __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MD5_TARGETS
#endif

MD5_TARGETS static void
md5_lanes(const uint8_t *keys[MD5_LANES], const Py_ssize_t lens[MD5_LANES], uint8_t *out[MD5_LANES],
          const uint8_t *limit)
{
    union {
        md5_vec v[16];                           /* word i of every lane's padded block */
        uint32_t u[16][MD5_LANES];
    } w;
    for (int i = 0; i < 16; i++)
        w.v[i] = (md5_vec){0};
    for (int l = 0; l < MD5_LANES; l++) {
        /* The key's words, then the word holding its end: the key's last bytes, 0x80, zeros.
         * The key is read in place where a whole block is readable (`limit`), else copied. */
        uint8_t copy[64];
        const uint8_t *key = keys[l];
        Py_ssize_t n = lens[l];
        if (limit - key < 64) {
            memset(copy, 0, sizeof copy);
            memcpy(copy, key, (size_t)n);
            key = copy;
        }
        int k = (int)n / 4, shift = (int)(n % 4) * 8;
        for (int i = 0; i < k; i++)
            w.u[i][l] = load_le32(key + 4 * i);
        uint32_t last = shift ? load_le32(key + 4 * k) & ((1U << shift) - 1) : 0;
        w.u[k][l] = last | (0x80U << shift);
        w.u[14][l] = (uint32_t)n * 8;            /* the bit length, a 64-bit LE count (< 2^32) */
    }
    md5_vec a, b, c, d;
    for (int l = 0; l < MD5_LANES; l++) {
        a[l] = 0x67452301; b[l] = 0xefcdab89; c[l] = 0x98badcfe; d[l] = 0x10325476;
    }
    MD5_64_STEPS(a, b, c, d, w.v);
    for (int l = 0; l < MD5_LANES; l++) {
        uint32_t h[4] = {0x67452301 + a[l], 0xefcdab89 + b[l], 0x98badcfe + c[l], 0x10325476 + d[l]};
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(out[l], h, 16);                       /* the digest is the words little-endian */
#else
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                out[l][4 * i + j] = (uint8_t)(h[i] >> (8 * j));
#endif
    }
}

static PyObject *
codec_md5(PyObject *self, PyObject *args)
{
    Py_buffer data;
    uint8_t digest[16];
    if (!PyArg_ParseTuple(args, "y*:md5", &data))
        return NULL;
    md5_digest((const uint8_t *)data.buf, data.len, digest);
    PyBuffer_Release(&data);
    return PyBytes_FromStringAndSize((const char *)digest, 16);
}

/* What the cleaner needs of one record: where its key is, and whether it has a value. */
typedef struct {
    int64_t offset;
    const uint8_t *key;          /* NULL: a null key */
    Py_ssize_t key_len;
    int value_null;
    int hashed;                  /* digest already known (the digest cache) */
    uint8_t digest[16];          /* MD5 of the key (filled by digest_spans) */
} KeySpan;

/* The MD5 of every non-null key, MD5_LANES at a time where the keys fit in one block. */
static void
digest_spans(KeySpan *spans, long long count, const uint8_t *limit)
{
    const uint8_t *keys[MD5_LANES];
    Py_ssize_t lens[MD5_LANES];
    uint8_t *outs[MD5_LANES];
    int n = 0;
    for (long long i = 0; i < count; i++) {
        KeySpan *s = &spans[i];
        if (s->key == NULL || s->hashed)
            continue;
        if (s->key_len > MD5_ONE_BLOCK_MAX) {
            md5_digest(s->key, s->key_len, s->digest);
            continue;
        }
        keys[n] = s->key;
        lens[n] = s->key_len;
        outs[n] = s->digest;
        if (++n == MD5_LANES) {
            md5_lanes(keys, lens, outs, limit);
            n = 0;
        }
    }
    for (int l = n; n > 0 && l < MD5_LANES; l++) {   /* fill the idle lanes with a copy */
        keys[l] = keys[0];
        lens[l] = lens[0];
        outs[l] = outs[0];
    }
    if (n > 0)
        md5_lanes(keys, lens, outs, limit);
}

/* Skip a record's headers with the checks of read_headers (1 = ok, 0 = the reference raises). */
static int
skip_headers(const uint8_t *d, Py_ssize_t len, Py_ssize_t *pos, Py_ssize_t end)
{
    int64_t n, klen;
    if (read_varint(d, len, pos, &n) < 0 || n < 0 || n > (int64_t)(end - *pos))
        return 0;
    for (int64_t h = 0; h < n; h++) {
        if (read_varint(d, len, pos, &klen) < 0 || klen < 0 || *pos + klen > end)
            return 0;
        *pos += klen;
        if (!skip_field(d, len, pos, end))
            return 0;
    }
    return 1;
}

#define WALK_PREFETCH_BYTES 2048   /* ahead of the walk: sections bigger than L2 stream in */

/* The walk of decode_walk without building objects: 1 = every record's span in `spans`, 0 = the
 * reference raises. */
static int
walk_key_spans(const uint8_t *d, Py_ssize_t len, long long base_offset, long long count,
               KeySpan *spans)
{
    Py_ssize_t pos = 0;          /* as in walk_valid: the next record starts at this one's end */
    for (long long i = 0; i < count; i++) {
        int64_t size, v, offset_delta, klen;
        if (pos >= len || read_varint(d, len, &pos, &size) < 0)
            return 0;
        Py_ssize_t end = pos + size;
        if (size < 0 || end > len)
            return 0;
        __builtin_prefetch(d + pos + WALK_PREFETCH_BYTES);  /* a hint only: never faults */
        Py_ssize_t q = pos + 1;                              /* attributes */
        if (read_varlong(d, len, &q, &v) < 0 || read_varint(d, len, &q, &offset_delta) < 0)
            return 0;
        if (read_varint(d, len, &q, &klen) < 0)
            return 0;
        spans[i].key = NULL;
        spans[i].key_len = 0;
        spans[i].hashed = 0;
        if (klen >= 0) {
            if (q + klen > end)
                return 0;
            spans[i].key = d + q;
            spans[i].key_len = (Py_ssize_t)klen;
            q += klen;
        }
        Py_ssize_t value_at = q;
        if (read_varint(d, len, &value_at, &v) < 0)
            return 0;
        spans[i].value_null = v < 0;
        if (!skip_field(d, len, &q, end) || !skip_headers(d, len, &q, end))
            return 0;
        if (q != end || __builtin_add_overflow((int64_t)base_offset, offset_delta, &spans[i].offset))
            return 0;
        pos = end;
    }
    return pos == len;
}

typedef struct OffsetTable OffsetTable;
static void cache_lookup_spans(const OffsetTable *t, KeySpan *spans, long long count);

/* The spans of a records section (PyMem buffer in *spans), 1; 0 = the reference raises; -1 = error.
 * `cached`: an OffsetTable whose digest cache supplies the digests it holds (NULL: hash all). */
static int
key_spans(const uint8_t *d, Py_ssize_t len, long long base_offset, long long count,
          const OffsetTable *cached, KeySpan **spans)
{
    *spans = NULL;
    if (count < 0 || count > len)           /* each record takes at least one byte */
        return count == 0 ? 1 : 0;
    *spans = PyMem_Malloc(sizeof(KeySpan) * (size_t)(count ? count : 1));
    if (*spans == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (!walk_key_spans(d, len, base_offset, count, *spans))
        return 0;
    if (cached != NULL)
        cache_lookup_spans(cached, *spans, count);
    digest_spans(*spans, count, d + len);
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* OffsetTable: the offset map's entries as Kafka's SkimpyOffsetMap holds them                */
/* ------------------------------------------------------------------------------------------ */
/*
 * An open-addressing table of 24-byte entries (16-byte MD5 digest + int64 offset), probed linearly
 * from the digest's first 8 bytes, as Kafka's SkimpyOffsetMap lays out its buffer. Unlike Kafka's
 * it starts small and doubles (kstore counts entries against the dedupe budget in Python). It
 * stands in for the dict of SkimpyOffsetMap.entries where the native codec runs: the same mapping
 * (digest bytes -> int offset: len, [], get, clear, items), without a Python object per entry, so
 * map_keys and filter_records read and write it in place.
 */
typedef struct {
    uint8_t digest[16];
    int64_t offset;
} TableEntry;

struct OffsetTable {
    PyObject_HEAD
    TableEntry *entries;
    uint8_t *used;
    Py_ssize_t capacity, size;
    /* The digest cache: the MD5 of each key map_keys put, by offset - cache_base, so the filter
     * pass over the same (dirty) records does not hash their keys again. At most cache_max
     * records (the map's max entries, at most DIGEST_CACHE_MAX_RECORDS); cached[i] holds
     * CACHE_* flags for slot i. */
    uint8_t (*cache)[16];
    uint8_t *cached;
    int64_t cache_base;
    Py_ssize_t cache_len, cache_cap, cache_max;
    /* The plain batches map_batches saw whole, by (segment, file position): with the cache they
     * are all the filter pass needs to drop such a batch without reading it again. */
    struct BatchSummary *summaries;
    Py_ssize_t summaries_len, summaries_cap;
};

#define CACHE_KNOWN 1        /* the record at this offset was seen by the map pass */
#define CACHE_KEYED 2        /* ... it has a key, whose digest is cached */
#define CACHE_TOMBSTONE 4    /* ... its value is null */
#define CACHE_SUPERSEDED 8   /* ... and a later record with the same key digest was mapped */

typedef struct BatchSummary {
    int64_t segment, position, base_offset, last_offset, base_timestamp, producer_id;
    Py_ssize_t size;
    long long records_count;
    int attributes;
} BatchSummary;

static PyTypeObject OffsetTableType;

static inline size_t
table_slot(const OffsetTable *t, const uint8_t digest[16])
{
    uint64_t h;
    memcpy(&h, digest, 8);
    return (size_t)(h & (uint64_t)(t->capacity - 1));
}

/* The slot holding `digest`, or the empty slot where it would go. */
static inline size_t
table_find(const OffsetTable *t, const uint8_t digest[16])
{
    size_t mask = (size_t)t->capacity - 1, i = table_slot(t, digest);
    while (t->used[i] && memcmp(t->entries[i].digest, digest, 16) != 0)
        i = (i + 1) & mask;
    return i;
}

static int
table_resize(OffsetTable *t, Py_ssize_t capacity)
{
    TableEntry *old_entries = t->entries;
    uint8_t *old_used = t->used;
    Py_ssize_t old_capacity = t->capacity;
    t->entries = PyMem_Calloc((size_t)capacity, sizeof(TableEntry));
    t->used = PyMem_Calloc((size_t)capacity, 1);
    if (t->entries == NULL || t->used == NULL) {
        PyMem_Free(t->entries);
        PyMem_Free(t->used);
        t->entries = old_entries;
        t->used = old_used;
        PyErr_NoMemory();
        return -1;
    }
    t->capacity = capacity;
    for (Py_ssize_t i = 0; i < old_capacity; i++) {
        if (old_used[i]) {
            size_t j = table_find(t, old_entries[i].digest);
            t->entries[j] = old_entries[i];
            t->used[j] = 1;
        }
    }
    PyMem_Free(old_entries);
    PyMem_Free(old_used);
    return 0;
}

static int
table_put(OffsetTable *t, const uint8_t digest[16], int64_t offset, int64_t *previous)
{
    if ((t->size + 1) * 2 > t->capacity && table_resize(t, t->capacity * 2) < 0)
        return -1;
    size_t i = table_find(t, digest);
    if (!t->used[i]) {
        memcpy(t->entries[i].digest, digest, 16);
        t->used[i] = 1;
        t->size++;
        *previous = -1;
    }
    else
        *previous = t->entries[i].offset;
    t->entries[i].offset = offset;
    return 0;
}

/* Start loading the slot where `digest` would be: the digests of a batch are known before its
 * puts and lookups, so the table's cache misses overlap instead of coming one after another. */
#define TABLE_PREFETCH_AHEAD 8

static inline void
table_prefetch(const OffsetTable *t, const uint8_t digest[16])
{
    size_t i = table_slot(t, digest);
    __builtin_prefetch(&t->entries[i]);
    __builtin_prefetch(&t->used[i]);
}

/* The offset of `digest`, or -1 when absent (SkimpyOffsetMap.get). */
static inline int64_t
table_get(const OffsetTable *t, const uint8_t digest[16])
{
    size_t i = table_find(t, digest);
    return t->used[i] ? t->entries[i].offset : -1;
}

/* At most this many digests are cached (16 MiB + 1 MiB of flags per million records: 34 MiB), and
 * at most SUMMARIES_MAX batches summarized (72 bytes each: 18 MiB), whatever the map's budget;
 * beyond that the filter pass hashes and reads as Kafka's does. */
#define DIGEST_CACHE_MAX_RECORDS (1 << 21)
#define SUMMARIES_MAX (1 << 18)

/* Remember the digest of the key at `offset` (a no-op beyond the cache's bound or where memory
 * runs short: the filter pass then hashes that key again). */
static void
cache_store(OffsetTable *t, int64_t offset, const uint8_t *digest, int value_null)
{
    if (t->cache_len == 0)
        t->cache_base = offset;
    int64_t i = offset - t->cache_base;
    if (i < 0 || i >= t->cache_max)
        return;
    if (i >= t->cache_cap) {
        Py_ssize_t cap = t->cache_cap ? t->cache_cap : 4096;
        while (cap <= i)
            cap *= 2;
        if (cap > t->cache_max)
            cap = t->cache_max;
        uint8_t (*cache)[16] = PyMem_Realloc(t->cache, (size_t)cap * 16);
        if (cache == NULL)
            return;
        t->cache = cache;
        uint8_t *cached = PyMem_Realloc(t->cached, (size_t)cap);
        if (cached == NULL)
            return;
        memset(cached + t->cache_cap, 0, (size_t)(cap - t->cache_cap));
        t->cached = cached;
        t->cache_cap = cap;
    }
    if (digest != NULL)
        memcpy(t->cache[i], digest, 16);
    t->cached[i] = CACHE_KNOWN | (digest != NULL ? CACHE_KEYED : 0) | (value_null ? CACHE_TOMBSTONE : 0);
    if (i >= t->cache_len)
        t->cache_len = i + 1;
}

/* The record at `previous` now has a newer one with its key digest at `offset`: whatever the map
 * ends up holding for that digest is at least `offset`, so the filter pass will drop it
 * (`should_retain_record`: an older record of a key) — and may do so without a lookup. Only a
 * record the map pass cached (CACHE_KNOWN) is flagged; the rest are looked up as ever. */
static inline void
cache_supersede(OffsetTable *t, int64_t previous, int64_t offset)
{
    int64_t i = previous - t->cache_base;
    if (previous >= 0 && previous < offset && i >= 0 && i < t->cache_len
            && (t->cached[i] & CACHE_KNOWN))
        t->cached[i] |= CACHE_SUPERSEDED;
}

static void
cache_lookup_spans(const OffsetTable *t, KeySpan *spans, long long count)
{
    for (long long k = 0; k < count; k++) {
        int64_t i = spans[k].offset - t->cache_base;
        if (spans[k].key != NULL && i >= 0 && i < t->cache_len && (t->cached[i] & CACHE_KEYED)) {
            memcpy(spans[k].digest, t->cache[i], 16);
            spans[k].hashed = 1;
        }
    }
}

#define TABLE_INITIAL_CAPACITY 64

static PyObject *
codec_offset_table(PyObject *self, PyObject *noargs)
{
    if (!(OffsetTableType.tp_flags & Py_TPFLAGS_READY) && PyType_Ready(&OffsetTableType) < 0)
        return NULL;
    OffsetTable *t = PyObject_New(OffsetTable, &OffsetTableType);
    if (t == NULL)
        return NULL;
    t->entries = NULL;
    t->used = NULL;
    t->capacity = t->size = 0;
    t->cache = NULL;
    t->cached = NULL;
    t->cache_base = 0;
    t->cache_len = t->cache_cap = t->cache_max = 0;
    t->summaries = NULL;
    t->summaries_len = t->summaries_cap = 0;
    if (table_resize(t, TABLE_INITIAL_CAPACITY) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    return (PyObject *)t;
}

static void
table_dealloc(OffsetTable *t)
{
    PyMem_Free(t->entries);
    PyMem_Free(t->used);
    PyMem_Free(t->cache);
    PyMem_Free(t->cached);
    PyMem_Free(t->summaries);
    PyObject_Free(t);
}

/* A 16-byte digest key (1), or -1 with the TypeError a non-digest key gets. */
static int
table_key(PyObject *key, uint8_t digest[16])
{
    if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) != 16) {
        PyErr_SetString(PyExc_TypeError, "an offset table key is a 16-byte MD5 digest (bytes)");
        return -1;
    }
    memcpy(digest, PyBytes_AS_STRING(key), 16);
    return 1;
}

static Py_ssize_t
table_len(OffsetTable *t)
{
    return t->size;
}

static PyObject *
table_subscript(OffsetTable *t, PyObject *key)
{
    uint8_t digest[16];
    if (table_key(key, digest) < 0)
        return NULL;
    size_t i = table_find(t, digest);
    if (!t->used[i]) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return PyLong_FromLongLong(t->entries[i].offset);
}

static int
table_ass_subscript(OffsetTable *t, PyObject *key, PyObject *value)
{
    uint8_t digest[16];
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "offset table entries are never deleted (clear() empties it)");
        return -1;
    }
    if (table_key(key, digest) < 0)
        return -1;
    long long offset = PyLong_AsLongLong(value);
    if (offset == -1 && PyErr_Occurred())
        return -1;
    int64_t previous;
    return table_put(t, digest, offset, &previous);
}

static PyObject *
table_get_method(OffsetTable *t, PyObject *args)
{
    PyObject *key, *missing = Py_None;
    uint8_t digest[16];
    if (!PyArg_ParseTuple(args, "O|O:get", &key, &missing) || table_key(key, digest) < 0)
        return NULL;
    size_t i = table_find(t, digest);
    return t->used[i] ? PyLong_FromLongLong(t->entries[i].offset) : Py_NewRef(missing);
}

static PyObject *
table_clear(OffsetTable *t, PyObject *noargs)
{
    memset(t->used, 0, (size_t)t->capacity);
    t->size = 0;
    if (t->cached != NULL)
        memset(t->cached, 0, (size_t)t->cache_len);
    t->cache_len = 0;
    t->summaries_len = 0;
    Py_RETURN_NONE;
}

static PyObject *
table_items(OffsetTable *t, PyObject *noargs)
{
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out != NULL && i < t->capacity; i++) {
        if (!t->used[i])
            continue;
        PyObject *pair = Py_BuildValue("(y#L)", (const char *)t->entries[i].digest, (Py_ssize_t)16,
                                       (long long)t->entries[i].offset);
        if (pair == NULL || PyList_Append(out, pair) < 0)
            Py_CLEAR(out);
        Py_XDECREF(pair);
    }
    return out;
}

static PyMappingMethods table_as_mapping = {
    (lenfunc)table_len, (binaryfunc)table_subscript, (objobjargproc)table_ass_subscript,
};

static PyMethodDef table_methods[] = {
    {"get", (PyCFunction)table_get_method, METH_VARARGS, "get(digest, default=None) -> offset"},
    {"clear", (PyCFunction)table_clear, METH_NOARGS, "Remove every entry."},
    {"items", (PyCFunction)table_items, METH_NOARGS, "[(digest, offset), ...] in table order."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject OffsetTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kstore._codec.OffsetTable",
    .tp_basicsize = sizeof(OffsetTable),
    .tp_dealloc = (destructor)table_dealloc,
    .tp_as_mapping = &table_as_mapping,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The offset map's entries: MD5 digest of a key -> latest offset (see offset_map.py).",
    .tp_methods = table_methods,
};

/* The latest offset of a key in the map, or -1 (SkimpyOffsetMap.get); -2 on a Python error. */
static int64_t
map_get(PyObject *entries, const KeySpan *s)
{
    if (Py_IS_TYPE(entries, &OffsetTableType))
        return table_get((OffsetTable *)entries, s->digest);
    PyObject *k = PyBytes_FromStringAndSize((const char *)s->digest, 16);
    if (k == NULL)
        return -2;
    PyObject *v = PyDict_GetItemWithError(entries, k);
    Py_DECREF(k);
    if (v == NULL)
        return PyErr_Occurred() ? -2 : -1;
    int64_t offset = PyLong_AsLongLong(v);
    return (offset == -1 && PyErr_Occurred()) ? -2 : offset;
}

/* The loop of offset_map.map_keys over a batch's spans: put each keyed record at or above `start`
 * until the map holds max_entries (digests also go to the table's cache). 0, or -1 on error. */
static int
map_spans(PyObject *entries, const KeySpan *spans, long long count, long long start,
          long long max_entries, long long *read, int *full, long long *latest)
{
    int is_table = Py_IS_TYPE(entries, &OffsetTableType);
    OffsetTable *t = (OffsetTable *)entries;
    *read = 0;
    *full = 0;
    *latest = -1;
    for (long long i = 0; i < count; i++) {
        const KeySpan *s = &spans[i];
        if (is_table && i + TABLE_PREFETCH_AHEAD < count && spans[i + TABLE_PREFETCH_AHEAD].key != NULL)
            table_prefetch(t, spans[i + TABLE_PREFETCH_AHEAD].digest);
        if (s->key != NULL && s->offset >= start) {
            Py_ssize_t size = is_table ? t->size : PyDict_GET_SIZE(entries);
            if (size >= max_entries) {
                *full = 1;
                return 0;
            }
            if (is_table) {
                int64_t previous;
                if (table_put(t, s->digest, s->offset, &previous) < 0)
                    return -1;
                cache_supersede(t, previous, s->offset);
                cache_store(t, s->offset, s->digest, s->value_null);
            }
            else {
                PyObject *k = PyBytes_FromStringAndSize((const char *)s->digest, 16);
                PyObject *v = PyLong_FromLongLong(s->offset);
                int bad = k == NULL || v == NULL || PyDict_SetItem(entries, k, v) < 0;
                Py_XDECREF(k);
                Py_XDECREF(v);
                if (bad)
                    return -1;
            }
            *latest = s->offset;
        }
        else if (is_table && s->offset >= start)
            cache_store(t, s->offset, NULL, s->value_null);
        (*read)++;
    }
    return 0;
}

static PyObject *
codec_map_keys(PyObject *self, PyObject *args)
{
    Py_buffer data;
    long long base_offset, count, start, max_entries, read, latest;
    int full;
    PyObject *entries, *result = NULL;
    KeySpan *spans = NULL;
    if (!PyArg_ParseTuple(args, "y*LLLOL:map_keys", &data, &base_offset, &count, &start,
                          &entries, &max_entries))
        return NULL;
    if (!Py_IS_TYPE(entries, &OffsetTableType) && !PyDict_CheckExact(entries)) {
        result = Py_NewRef(Py_None);                 /* another mapping: the reference's call */
        goto done;
    }
    if (Py_IS_TYPE(entries, &OffsetTableType))
        ((OffsetTable *)entries)->cache_max = max_entries < DIGEST_CACHE_MAX_RECORDS
                                              ? (Py_ssize_t)max_entries : DIGEST_CACHE_MAX_RECORDS;
    int r = key_spans((const uint8_t *)data.buf, data.len, base_offset, count, NULL, &spans);
    if (r <= 0) {
        result = r < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    if (map_spans(entries, spans, count, start, max_entries, &read, &full, &latest) == 0)
        result = Py_BuildValue("(LOL)", read, full ? Py_True : Py_False, latest);
done:
    PyMem_Free(spans);
    PyBuffer_Release(&data);
    return result;
}

/* What filter_records counts besides the records it keeps. */
typedef struct {
    long long kept, invalid, tombstones_dropped, tombstones_kept;
} FilterCounts;

/* The loop of cleaner.filter_records (should_retain_record rule by rule): keep[i] for each span.
 * 0, or -1 on a Python error. */
static int
filter_spans(PyObject *entries, const KeySpan *spans, long long count, long long map_latest,
             int has_horizon, long long horizon, long long now, uint8_t *keep, FilterCounts *c)
{
    memset(c, 0, sizeof *c);
    for (long long i = 0; i < count; i++) {
        const KeySpan *s = &spans[i];
        if (s->key == NULL && s->offset <= map_latest)
            c->invalid++;
        if (s->offset > map_latest)
            keep[i] = 1;
        else if (s->key == NULL)
            keep[i] = 0;
        else {
            int64_t latest = map_get(entries, s);
            if (latest == -2)
                return -1;
            if (s->offset < latest)
                keep[i] = 0;
            else if (!s->value_null)
                keep[i] = 1;
            else
                keep[i] = !has_horizon || now < horizon;
        }
        if (keep[i]) {
            c->kept++;
            c->tombstones_kept += s->value_null;
        }
        else if (s->value_null && s->key != NULL && has_horizon)
            c->tombstones_dropped++;
    }
    return 0;
}

static PyObject *
codec_filter_records(PyObject *self, PyObject *args)
{
    Py_buffer data;
    long long base_offset, count, map_latest, now, horizon = 0;
    PyObject *entries, *horizon_obj, *result = NULL, *kept = NULL;
    KeySpan *spans = NULL;
    uint8_t *keep = NULL;
    FilterCounts c;
    if (!PyArg_ParseTuple(args, "y*LLOLOL:filter_records", &data, &base_offset, &count,
                          &entries, &map_latest, &horizon_obj, &now))
        return NULL;
    if (!Py_IS_TYPE(entries, &OffsetTableType) && !PyDict_CheckExact(entries)) {
        result = Py_NewRef(Py_None);                 /* another mapping: the reference's call */
        goto done;
    }
    int has_horizon = horizon_obj != Py_None;
    if (has_horizon) {
        horizon = PyLong_AsLongLong(horizon_obj);
        if (horizon == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            result = Py_NewRef(Py_None);             /* out of range: the reference decides */
            goto done;
        }
    }
    int r = key_spans((const uint8_t *)data.buf, data.len, base_offset, count, NULL, &spans);
    if (r <= 0) {
        result = r < 0 ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    if ((keep = PyMem_Malloc((size_t)(count ? count : 1))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (filter_spans(entries, spans, count, map_latest, has_horizon, horizon, now, keep, &c) < 0)
        goto done;
    if ((kept = PyList_New(0)) == NULL)
        goto done;
    for (long long i = 0; i < count; i++) {
        if (!keep[i])
            continue;
        PyObject *index = PyLong_FromLongLong(i);
        int bad = index == NULL || PyList_Append(kept, index) < 0;
        Py_XDECREF(index);
        if (bad)
            goto done;
    }
    result = Py_BuildValue("(OLLL)", kept, c.invalid, c.tombstones_dropped, c.tombstones_kept);
done:
    Py_XDECREF(kept);
    PyMem_Free(keep);
    PyMem_Free(spans);
    PyBuffer_Release(&data);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* The cleaner's per-buffer walks: many batches per call                                      */
/* ------------------------------------------------------------------------------------------ */
/*
 *   map_batches(buffer, pos, start, stop_offset, table, max_entries, map_latest
 *               [, segment, buffer's file position])
 *       -> (pos, status, records read, map latest offset)         Cleaner._map_segment's loop
 *       (given the segment and position, each batch seen whole is summarized for skip_batches)
 *   filter_batches(buffer, pos, table, map_latest, now, upper_bound, producers)
 *       -> (pos, kept [(begin, end, last offset, max timestamp)], records read, records
 *           written, invalid, tombstones dropped, bytes read)      Cleaner._clean_into's loop
 *
 * `buffer` holds whole batches as read_batches reads them. Each walk handles, from `pos`, the
 * batches whose outcome needs nothing but the offset map: complete, magic 2, uncompressed,
 * neither transactional nor control. It stops at the first other batch, and the cleaner's Python
 * loop takes that one (transactions, markers, compression, re-encoding, errors) as it always has,
 * then calls again. filter_batches also leaves to Python a batch from a producer in `producers`
 * (the last batch of a producer is kept even when empty), a batch it would keep only in part or
 * stamp with a delete horizon, and an emptied batch ending at the upper bound.
 */

typedef struct {
    int64_t base_offset, base_timestamp, max_timestamp, producer_id, last_offset;
    int attributes;
    long long records_count;
    Py_ssize_t size;                      /* LOG_OVERHEAD + batchLength */
} SimpleBatch;

/* 1 with the header in *b when the batch at `pos` is one the walks handle by themselves. */
static int
simple_batch(const uint8_t *d, Py_ssize_t len, Py_ssize_t pos, SimpleBatch *b)
{
    if (len - pos < BATCH_OVERHEAD)
        return 0;
    int32_t length = (int32_t)load_be(d + pos + 8, 4);
    if (length < BATCH_MIN_LENGTH || length > len - pos - BATCH_LOG_OVERHEAD
            || BATCH_LOG_OVERHEAD + length < BATCH_OVERHEAD || d[pos + 16] != 2)
        return 0;
    b->attributes = (int)load_be(d + pos + 21, 2);
    if (b->attributes & (0x07 | 0x10 | 0x20))  /* compressed, transactional, control */
        return 0;
    b->records_count = (int32_t)load_be(d + pos + 57, 4);
    if (b->records_count < 0)
        return 0;
    b->size = BATCH_LOG_OVERHEAD + length;
    b->base_offset = (int64_t)load_be(d + pos, 8);
    b->last_offset = b->base_offset + (int32_t)load_be(d + pos + 23, 4);
    b->base_timestamp = (int64_t)load_be(d + pos + 27, 8);
    b->max_timestamp = (int64_t)load_be(d + pos + 35, 8);
    b->producer_id = (int64_t)load_be(d + pos + 43, 8);
    return 1;
}

enum { WALK_GO_ON = 0, WALK_STOP_OFFSET = 1, WALK_MAP_FULL = 2 };

/* Is `producer_id` one of `producers` (the log's active producers, whose last batch is kept even
 * when emptied)? 1 / 0, or -1 on a Python error. No producer id (-1) is never one. */
static int
known_producer(PyObject *producers, int64_t producer_id)
{
    if (producer_id == -1)
        return 0;
    PyObject *pid = PyLong_FromLongLong(producer_id);
    int known = pid == NULL ? -1 : PyDict_Contains(producers, pid);
    Py_XDECREF(pid);
    return known;
}

/* Keep the summary of a plain batch the map pass saw whole (each record at base + i, every one
 * in the cache), so that the filter pass can decide it without its bytes. 0, or -1 on error. */
static int
summarize(OffsetTable *t, const SimpleBatch *b, const KeySpan *spans, int64_t segment,
          int64_t position)
{
    for (long long i = 0; i < b->records_count; i++) {
        int64_t c = spans[i].offset - t->cache_base;
        if (spans[i].offset != b->base_offset + i || c < 0 || c >= t->cache_len
                || !(t->cached[c] & CACHE_KNOWN))
            return 0;
    }
    if (t->summaries_len == t->summaries_cap) {
        Py_ssize_t cap = t->summaries_cap ? t->summaries_cap * 2 : 256;
        if (cap > SUMMARIES_MAX)
            return 0;                        /* bounded: the filter pass reads the rest */
        BatchSummary *more = PyMem_Realloc(t->summaries, (size_t)cap * sizeof(BatchSummary));
        if (more == NULL)
            return 0;                        /* short of memory: the filter pass reads it */
        t->summaries = more;
        t->summaries_cap = cap;
    }
    BatchSummary *s = &t->summaries[t->summaries_len++];
    s->segment = segment;
    s->position = position;
    s->base_offset = b->base_offset;
    s->last_offset = b->last_offset;
    s->base_timestamp = b->base_timestamp;
    s->producer_id = b->producer_id;
    s->size = b->size;
    s->records_count = b->records_count;
    s->attributes = b->attributes;
    return 0;
}

static PyObject *
codec_map_batches(PyObject *self, PyObject *args)
{
    Py_buffer data;
    Py_ssize_t pos;
    long long start, stop_offset, max_entries, map_latest, read_total = 0;
    long long segment = -1, chunk_position = 0;
    PyObject *entries, *result = NULL;
    int status = WALK_GO_ON;
    if (!PyArg_ParseTuple(args, "y*nLLO!LL|LL:map_batches", &data, &pos, &start, &stop_offset,
                          &OffsetTableType, &entries, &max_entries, &map_latest, &segment,
                          &chunk_position))
        return NULL;
    OffsetTable *table = (OffsetTable *)entries;
    table->cache_max = max_entries < DIGEST_CACHE_MAX_RECORDS
                       ? (Py_ssize_t)max_entries : DIGEST_CACHE_MAX_RECORDS;
    const uint8_t *d = data.buf;
    SimpleBatch b;
    while (pos >= 0 && simple_batch(d, data.len, pos, &b)) {
        if (b.base_offset >= stop_offset) {
            status = WALK_STOP_OFFSET;       /* the uncleanable part stays out of the map */
            break;
        }
        KeySpan *spans;
        long long read, latest;
        int full;
        int r = key_spans(d + pos + BATCH_OVERHEAD, b.size - BATCH_OVERHEAD,
                          b.base_offset, b.records_count, NULL, &spans);
        if (r < 0 || (r > 0 && map_spans(entries, spans, b.records_count, start, max_entries,
                                         &read, &full, &latest) < 0)) {
            PyMem_Free(spans);
            goto done;
        }
        if (r > 0 && !full && segment >= 0 && summarize(table, &b, spans, segment, chunk_position + pos) < 0) {
            PyMem_Free(spans);
            goto done;
        }
        PyMem_Free(spans);
        if (r == 0)
            break;                           /* malformed: the reference raises */
        read_total += read;
        if (latest >= 0)
            map_latest = latest;
        if (full) {
            status = WALK_MAP_FULL;
            break;
        }
        if (b.last_offset >= start)
            map_latest = b.last_offset;
        pos += b.size;
    }
    result = Py_BuildValue("(niLL)", pos, status, read_total, map_latest);
done:
    PyBuffer_Release(&data);
    return result;
}

static PyObject *
codec_filter_batches(PyObject *self, PyObject *args)
{
    Py_buffer data;
    Py_ssize_t pos;
    long long map_latest, now, upper_bound;
    long long records_read = 0, records_written = 0, invalid = 0, dropped = 0, bytes_read = 0;
    PyObject *entries, *producers, *result = NULL, *kept = NULL;
    uint8_t *keep = NULL;
    Py_ssize_t keep_cap = 0;
    if (!PyArg_ParseTuple(args, "y*nO!LLLO!:filter_batches", &data, &pos, &OffsetTableType,
                          &entries, &map_latest, &now, &upper_bound, &PyDict_Type, &producers))
        return NULL;
    if ((kept = PyList_New(0)) == NULL)
        goto done;
    const uint8_t *d = data.buf;
    SimpleBatch b;
    while (pos >= 0 && simple_batch(d, data.len, pos, &b)) {
        int known = known_producer(producers, b.producer_id);
        if (known < 0)
            goto done;
        if (known)
            break;                           /* maybe a producer's last batch: Python decides */
        if (b.records_count > keep_cap) {
            PyMem_Free(keep);
            keep_cap = b.records_count;
            if ((keep = PyMem_Malloc((size_t)keep_cap)) == NULL) {
                PyErr_NoMemory();
                goto done;
            }
        }
        KeySpan *spans;
        FilterCounts c;
        int has_horizon = (b.attributes & 0x40) != 0;
        int r = key_spans(d + pos + BATCH_OVERHEAD, b.size - BATCH_OVERHEAD,
                          b.base_offset, b.records_count, (OffsetTable *)entries, &spans);
        if (r < 0 || (r > 0 && filter_spans(entries, spans, b.records_count, map_latest, has_horizon,
                                            b.base_timestamp, now, keep, &c) < 0)) {
            PyMem_Free(spans);
            goto done;
        }
        PyMem_Free(spans);
        if (r == 0)
            break;                           /* malformed: the reference raises */
        if (c.kept > 0 && (c.kept < b.records_count || (c.tombstones_kept > 0 && !has_horizon)))
            break;                           /* rewritten in part or stamped: Python re-encodes */
        if (c.kept == 0 && b.last_offset + 1 == upper_bound)
            break;                           /* kept as an empty batch: Python builds it */
        if (c.kept > 0) {
            PyObject *span = Py_BuildValue("(nnLL)", pos, pos + b.size, (long long)b.last_offset,
                                           (long long)b.max_timestamp);
            int bad = span == NULL || PyList_Append(kept, span) < 0;
            Py_XDECREF(span);
            if (bad)
                goto done;
        }
        records_read += b.records_count;
        records_written += c.kept;
        invalid += c.invalid;
        dropped += c.tombstones_dropped;
        bytes_read += b.size;
        pos += b.size;
    }
    result = Py_BuildValue("(nOLLLLL)", pos, kept, records_read, records_written, invalid, dropped,
                           bytes_read);
done:
    Py_XDECREF(kept);
    PyMem_Free(keep);
    PyBuffer_Release(&data);
    return result;
}

/* The summary of the batch at (segment, position), or NULL (the summaries are in that order). */
static const BatchSummary *
find_summary(const OffsetTable *t, int64_t segment, int64_t position)
{
    Py_ssize_t lo = 0, hi = t->summaries_len;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        const BatchSummary *s = &t->summaries[mid];
        if (s->segment < segment || (s->segment == segment && s->position < position))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < t->summaries_len && t->summaries[lo].segment == segment
            && t->summaries[lo].position == position)
        return &t->summaries[lo];
    return NULL;
}

/* Does every record of the summarized batch have a newer one with its key (CACHE_SUPERSEDED),
 * at or below `map_latest`? Then filter_spans would keep none of them: each is keyed, below the
 * map's latest offset, and older than the map's offset for its key. Its tombstones are counted. */
static int
all_superseded(const OffsetTable *t, const BatchSummary *b, long long map_latest,
               long long *tombstones)
{
    const uint8_t want = CACHE_KNOWN | CACHE_KEYED | CACHE_SUPERSEDED;
    int64_t first = b->base_offset - t->cache_base;
    if (b->last_offset > map_latest || first < 0 || first + b->records_count > t->cache_len)
        return 0;
    long long n = 0;
    for (long long i = 0; i < b->records_count; i++) {
        uint8_t flags = t->cached[first + i];
        if ((flags & want) != want)
            return 0;
        n += (flags & CACHE_TOMBSTONE) != 0;
    }
    *tombstones = n;
    return 1;
}

/*
 *   skip_batches(table, segment, position, map_latest, now, upper_bound, producers)
 *       -> (position, records read, invalid, tombstones dropped, bytes read)
 *
 * The filter pass's shortcut over the dirty section: from `position` in `segment`, the batches
 * the map pass summarized whose records filter_batches would all drop (decided from the cached
 * digests and flags, as filter_batches decides from the bytes) are passed over without being
 * read. It stops at the first batch it cannot drop so: the cleaner reads from there.
 */
static PyObject *
codec_skip_batches(PyObject *self, PyObject *args)
{
    long long segment, position, map_latest, now, upper_bound;
    long long records_read = 0, invalid = 0, dropped = 0, bytes_read = 0;
    PyObject *entries, *producers;
    KeySpan *spans = NULL;
    uint8_t *keep = NULL;
    Py_ssize_t cap = 0;
    if (!PyArg_ParseTuple(args, "O!LLLLLO!:skip_batches", &OffsetTableType, &entries, &segment,
                          &position, &map_latest, &now, &upper_bound, &PyDict_Type, &producers))
        return NULL;
    OffsetTable *t = (OffsetTable *)entries;
    const BatchSummary *b;
    while ((b = find_summary(t, segment, position)) != NULL) {
        int known = known_producer(producers, b->producer_id);
        if (known < 0)
            goto error;
        if (known)
            break;
        if (b->last_offset + 1 == upper_bound)
            break;
        long long tombstones;
        if (all_superseded(t, b, map_latest, &tombstones)) {  /* dropped whole, no lookups */
            records_read += b->records_count;
            if (b->attributes & 0x40)        /* as filter_spans counts them: with a horizon */
                dropped += tombstones;
            bytes_read += b->size;
            position += b->size;
            continue;
        }
        if (b->records_count > cap) {
            PyMem_Free(spans);
            PyMem_Free(keep);
            cap = b->records_count;
            spans = PyMem_Malloc(sizeof(KeySpan) * (size_t)cap);
            keep = PyMem_Malloc((size_t)cap);
            if (spans == NULL || keep == NULL) {
                PyErr_NoMemory();
                goto error;
            }
        }
        for (long long i = 0; i < b->records_count; i++) {   /* the spans, from the cache */
            int64_t c = b->base_offset + i - t->cache_base;
            uint8_t flags = t->cached[c];
            spans[i].offset = b->base_offset + i;
            spans[i].key = (flags & CACHE_KEYED) ? t->cache[c] : NULL;
            spans[i].value_null = (flags & CACHE_TOMBSTONE) != 0;
            if (flags & CACHE_KEYED)
                memcpy(spans[i].digest, t->cache[c], 16);
        }
        FilterCounts counts;
        if (filter_spans(entries, spans, b->records_count, map_latest, (b->attributes & 0x40) != 0,
                         b->base_timestamp, now, keep, &counts) < 0)
            goto error;
        if (counts.kept > 0)
            break;                           /* kept (whole or in part): read it */
        records_read += b->records_count;
        invalid += counts.invalid;
        dropped += counts.tombstones_dropped;
        bytes_read += b->size;
        position += b->size;
    }
    PyMem_Free(spans);
    PyMem_Free(keep);
    return Py_BuildValue("(LLLLL)", position, records_read, invalid, dropped, bytes_read);
error:
    PyMem_Free(spans);
    PyMem_Free(keep);
    return NULL;
}
