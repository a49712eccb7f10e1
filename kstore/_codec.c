/*
 * kstore._codec: the per-record work of kstore/records.py, in C.
 *
 * The pure-Python functions in kstore/records.py are the reference: the chapters show them and the
 * exercises plug into them. Each function here mirrors one of them and returns the same value for
 * every input the reference accepts:
 *
 *   validate_records(data, base_offset, records_count)        -> records.validate_records
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
        pos += 1;                                            /* attributes */
        if (read_varlong(d, end_all, &pos, &v) < 0)          /* timestamp delta */
            return 0;
        if (read_varint(d, end_all, &pos, &v) < 0 || v != i) /* offset delta */
            return 0;
        for (int field = 0; field < 2; field++) {            /* key, value */
            if (read_varint(d, end_all, &pos, &v) < 0)
                return 0;
            if (v < 0) {
                if (field == 0)
                    *null_key = 1;
            }
            else if (pos + v > end)
                return 0;
            else
                pos += v;
        }
        if (read_varint(d, end_all, &pos, &v) < 0)
            return 0;
        int64_t n_headers = v;
        if (n_headers < 0 || n_headers > (int64_t)(end - pos))
            return 0;
        for (int64_t h = 0; h < n_headers; h++) {
            if (read_varint(d, end_all, &pos, &v) < 0 || v < 0)
                return 0;
            pos += v;
            if (read_varint(d, end_all, &pos, &v) < 0)
                return 0;
            if (v > 0)
                pos += v;
            if (pos > end)
                return 0;
        }
        if (pos != end)
            return 0;
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
    int ok = 1;
    int64_t *lengths = (int64_t *)PyBytes_AS_STRING(out);
    const uint8_t *d = (const uint8_t *)data.buf;
    Py_ssize_t len = data.len, pos = 0;
    Py_BEGIN_ALLOW_THREADS
    for (long long i = 0; i < count; i++) {
        uint64_t z;
        if (read_unsigned(d, len, &pos, MAX_VARINT_BYTES, &z) < 0 || z > 0xFFFFFFFFULL || (z & 1)) {
            ok = 0;
            break;
        }
        lengths[i] = (int64_t)z;
        pos += (Py_ssize_t)(z >> 1);
        if (pos > len) {
            ok = 0;
            break;
        }
    }
    if (pos != len)
        ok = 0;
    Py_END_ALLOW_THREADS
    if (!ok) {
        Py_DECREF(out);
        out = Py_NewRef(Py_None);
    }
done:
    PyBuffer_Release(&data);
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

static PyMethodDef codec_methods[] = {
    {"validate_records", codec_validate_records, METH_VARARGS,
     "validate_records(data, base_offset, records_count) -> (count, null_key) or None.\n"
     "Mirrors kstore.records.validate_records; None where the reference raises."},
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
    {"record_size_in_bytes", (PyCFunction)(void (*)(void))codec_record_size_in_bytes, METH_FASTCALL,
     "record_size_in_bytes(offset_delta, timestamp_delta, key, value, headers) -> int or None.\n"
     "Mirrors kstore.records.record_size_in_bytes; None where the reference raises or takes other types."},
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
