// The key memory's reader and banned-token search, compiled (issue 56): the same answers as layer.py's
// KeyMemory, at a fraction of a microsecond per token instead of a few (the mask's cost target, <= 1.1x).
//
// Why bytes: JSON's structure is ASCII, so reading the output's bytes is exact, and a character cut between two
// tokens needs no special case (its bytes simply follow each other). Keys are kept decoded (escapes resolved to
// UTF-8), so a key spelled "\u0061" and one spelled "a" are the same key, as the validator reads them.
//
// banned(): in an object writing a key with no escape in it, the tokens whose bytes before their first quote
// finish a key the object has (one hash lookup per written key that the key begun starts). Every other way a
// token could complete a key twice (a backslash before its first quote, a whole key between two of its quotes
// in an object holding that key, four quotes or more, an escape in the key begun) is found by reading the token
// from the current state on a copy. Nearly every token is decided with no copy at all.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

enum Kind : uint8_t { OBJECT, ARRAY, STRING, NUMBER, LITERAL };
enum State : uint8_t { START, KEY, COLON, VALUE, AFTER, NEXT };

struct Frame {
    Kind kind;
    State state = START;
    bool backslash = false;  // string or key: the last character was an escaping backslash
    uint8_t hex_left = 0;    // string or key: hex digits of a \u escape still to come
    bool marked = false;     // object: one of its keys is some token's whole text between two quotes
    std::vector<std::string> keys;  // object: the keys written, decoded
    std::string raw;                // object: the key being written (as written); literal: its letters so far
    explicit Frame(Kind k) : kind(k) {}
};

using Ids = std::vector<int32_t>;

struct Vocab {
    std::vector<std::string> texts;  // per token id (empty: no text)
    std::vector<bool> has_text;
    std::vector<int32_t> quoted;                  // tokens holding a quote
    std::unordered_map<std::string, Ids> heads;   // bytes before the first quote (no backslash) -> tokens
    Ids escaped_heads;                            // a backslash before the first quote: read to be sure
    std::unordered_map<std::string, Ids> segments;  // decoded text between two quotes -> tokens
    Ids quadruple;                                // four quotes or more
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool is_number_char(char c) {
    return (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.' || c == 'e' || c == 'E';
}

void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

bool hex4(const std::string& raw, size_t at, uint32_t& value) {
    if (at + 4 > raw.size()) return false;
    value = 0;
    for (size_t i = at; i < at + 4; ++i) {
        char c = raw[i];
        if (!is_hex(c)) return false;
        value = value * 16 + static_cast<uint32_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return true;
}

// A string's JSON text (without quotes) as the UTF-8 bytes it spells; the text itself when it is not valid.
std::string decode(const std::string& raw) {
    if (raw.find('\\') == std::string::npos) return raw;
    std::string out;
    out.reserve(raw.size());
    for (size_t i = 0; i < raw.size();) {
        char c = raw[i];
        if (c != '\\') {
            out += c;
            ++i;
            continue;
        }
        if (i + 1 >= raw.size()) return raw;
        char e = raw[i + 1];
        i += 2;
        switch (e) {
            case '"': out += '"'; break;
            case '\\': out += '\\'; break;
            case '/': out += '/'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'n': out += '\n'; break;
            case 'r': out += '\r'; break;
            case 't': out += '\t'; break;
            case 'u': {
                uint32_t cp;
                if (!hex4(raw, i, cp)) return raw;
                i += 4;
                uint32_t low;
                if (cp >= 0xD800 && cp < 0xDC00 && i + 6 <= raw.size() && raw[i] == '\\' && raw[i + 1] == 'u' &&
                    hex4(raw, i + 2, low) && low >= 0xDC00 && low < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                    i += 6;
                }
                put_utf8(out, cp);
                break;
            }
            default: return raw;
        }
    }
    return out;
}

const char* const LITERALS[] = {"true", "false", "null"};

struct Reader {
    std::vector<Frame> stack;
    bool done = false;
    bool broken = false;
    bool repeated = false;  // a key was completed in an object that has it already

    void push(const std::string& text, const Vocab& vocab) {
        for (char c : text) {
            if (broken) return;
            step(c, vocab);
        }
    }

    void step(char c, const Vocab& vocab) {
        if (stack.empty()) {
            if (done || is_space(c)) return;
            open(c);
            return;
        }
        Frame& top = stack.back();
        switch (top.kind) {
            case OBJECT: in_object(top, c, vocab); break;
            case STRING: in_string(top, c); break;
            case ARRAY: in_array(top, c); break;
            case NUMBER:
                if (!is_number_char(c)) {
                    close();
                    step(c, vocab);
                }
                break;
            case LITERAL: in_literal(top, c); break;
        }
    }

    void open(char c) {
        Kind kind;
        if (c == '{') kind = OBJECT;
        else if (c == '[') kind = ARRAY;
        else if (c == '"') kind = STRING;
        else if (c == '-' || (c >= '0' && c <= '9')) kind = NUMBER;
        else if (c == 't' || c == 'f' || c == 'n') kind = LITERAL;
        else {
            broken = true;
            return;
        }
        stack.emplace_back(kind);
        if (kind == LITERAL) stack.back().raw = c;
    }

    void close() {
        stack.pop_back();
        if (stack.empty()) {
            done = true;
            return;
        }
        stack.back().state = AFTER;
    }

    // Escape bookkeeping shared by strings and keys: whether ``c`` is the closing quote.
    static bool closes(Frame& top, char c) {
        if (top.backslash) {
            top.backslash = false;
            if (c == 'u') top.hex_left = 4;
            return false;
        }
        if (top.hex_left > 0) {
            if (is_hex(c)) {
                --top.hex_left;
                return false;
            }
            top.hex_left = 0;  // not JSON, and never under a JSON mask: read as layer.py's reader reads it
            if (c == '"') return false;
        }
        if (c == '\\') {
            top.backslash = true;
            return false;
        }
        return c == '"';
    }

    void in_string(Frame& top, char c) {
        if (closes(top, c)) close();
    }

    void in_literal(Frame& top, char c) {
        top.raw += c;
        bool prefix = false;
        for (const char* word : LITERALS) {
            if (top.raw == word) {
                close();
                return;
            }
            if (std::strncmp(word, top.raw.c_str(), top.raw.size()) == 0 && std::strlen(word) > top.raw.size())
                prefix = true;
        }
        if (!prefix) broken = true;
    }

    void in_array(Frame& top, char c) {
        if (is_space(c)) return;
        if (c == ']') close();
        else if (c == ',') top.state = VALUE;
        else open(c);
    }

    void in_object(Frame& top, char c, const Vocab& vocab) {
        State state = top.state;
        if (state == KEY) {
            if (closes(top, c)) {
                std::string key = decode(top.raw);
                if (std::find(top.keys.begin(), top.keys.end(), key) != top.keys.end()) repeated = true;
                if (vocab.segments.count(key)) top.marked = true;
                top.keys.push_back(std::move(key));
                top.state = COLON;
                top.raw.clear();
            } else {
                top.raw += c;
            }
            return;
        }
        if (is_space(c)) return;
        if (c == '}') close();
        else if (c == '"' && (state == START || state == NEXT)) {
            top.state = KEY;
            top.raw.clear();
        } else if (c == ':' && state == COLON) top.state = VALUE;
        else if (c == ',' && state == AFTER) top.state = NEXT;
        else if (state == VALUE) open(c);
        else broken = true;
    }
};

// --- the vocabulary ------------------------------------------------------------------------------

struct VocabObject {
    PyObject_HEAD
    Vocab* vocab;
    PyObject* quoted_set;  // frozenset of the quote tokens' ids
};

void vocab_dealloc(VocabObject* self) {
    delete self->vocab;
    Py_XDECREF(self->quoted_set);
    Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

int vocab_init(VocabObject* self, PyObject* args, PyObject*) {
    PyObject* pieces;
    if (!PyArg_ParseTuple(args, "O", &pieces)) return -1;
    PyObject* sequence = PySequence_Fast(pieces, "Vocabulary takes a sequence of bytes or None per token");
    if (!sequence) return -1;
    auto vocab = new Vocab();
    Py_ssize_t size = PySequence_Fast_GET_SIZE(sequence);
    vocab->texts.resize(size);
    vocab->has_text.assign(size, false);
    PyObject* quoted_list = PyList_New(0);
    for (Py_ssize_t index = 0; index < size; ++index) {
        PyObject* piece = PySequence_Fast_GET_ITEM(sequence, index);
        if (piece == Py_None) continue;
        char* data;
        Py_ssize_t length;
        if (PyBytes_AsStringAndSize(piece, &data, &length) < 0) {
            Py_DECREF(sequence);
            Py_DECREF(quoted_list);
            delete vocab;
            return -1;
        }
        std::string text(data, length);
        vocab->has_text[index] = true;
        size_t first = text.find('"');
        if (first != std::string::npos) {
            int32_t id = static_cast<int32_t>(index);
            vocab->quoted.push_back(id);
            PyObject* number = PyLong_FromSsize_t(index);
            PyList_Append(quoted_list, number);
            Py_DECREF(number);
            std::string head = text.substr(0, first);
            if (head.find('\\') == std::string::npos) vocab->heads[head].push_back(id);
            else vocab->escaped_heads.push_back(id);
            std::vector<size_t> quotes;
            for (size_t at = 0; at < text.size(); ++at)
                if (text[at] == '"') quotes.push_back(at);
            std::vector<std::string> seen;
            for (size_t i = 0; i + 1 < quotes.size(); ++i) {
                std::string part = decode(text.substr(quotes[i] + 1, quotes[i + 1] - quotes[i] - 1));
                if (std::find(seen.begin(), seen.end(), part) == seen.end()) {
                    vocab->segments[part].push_back(id);
                    seen.push_back(part);
                }
            }
            if (quotes.size() >= 4) vocab->quadruple.push_back(id);
        }
        vocab->texts[index] = std::move(text);
    }
    Py_DECREF(sequence);
    delete self->vocab;
    self->vocab = vocab;
    Py_XDECREF(self->quoted_set);
    self->quoted_set = PyFrozenSet_New(quoted_list);
    Py_DECREF(quoted_list);
    return self->quoted_set ? 0 : -1;
}

PyObject* vocab_quoted(VocabObject* self, void*) {
    Py_INCREF(self->quoted_set);
    return self->quoted_set;
}

PyGetSetDef vocab_getset[] = {
    {"quoted_ids", reinterpret_cast<getter>(vocab_quoted), nullptr, "the tokens holding a quote", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject VocabType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// --- one row's memory ----------------------------------------------------------------------------

constexpr size_t CHECKPOINT = 16;  // tokens between saved reader states (a rollback reads at most this many again)

struct MemoryObject {
    PyObject_HEAD
    VocabObject* owner;
    Reader* reader;
    std::vector<int32_t>* tokens;
    std::vector<std::pair<size_t, Reader>>* checkpoints;  // (tokens read, the reader then)
    PyObject* answer;  // banned() for the output as it is, or null
};

PyObject* EMPTY;  // the empty tuple, the answer at nearly every token

void memory_dealloc(MemoryObject* self) {
    delete self->reader;
    delete self->tokens;
    delete self->checkpoints;
    Py_XDECREF(self->answer);
    Py_XDECREF(reinterpret_cast<PyObject*>(self->owner));
    Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

int memory_init(MemoryObject* self, PyObject* args, PyObject*) {
    PyObject* vocab;
    if (!PyArg_ParseTuple(args, "O!", &VocabType, &vocab)) return -1;
    Py_INCREF(vocab);
    Py_XDECREF(reinterpret_cast<PyObject*>(self->owner));
    self->owner = reinterpret_cast<VocabObject*>(vocab);
    delete self->reader;
    delete self->tokens;
    delete self->checkpoints;
    self->reader = new Reader();
    self->tokens = new std::vector<int32_t>();
    self->checkpoints = new std::vector<std::pair<size_t, Reader>>{{0, Reader()}};
    Py_CLEAR(self->answer);
    return 0;
}

void read_token(MemoryObject* self, int32_t token) {
    const Vocab& vocab = *self->owner->vocab;
    if (token >= 0 && static_cast<size_t>(token) < vocab.texts.size() && vocab.has_text[token])
        self->reader->push(vocab.texts[token], vocab);
}

PyObject* memory_advance(MemoryObject* self, PyObject* arg) {
    long token = PyLong_AsLong(arg);
    if (token == -1 && PyErr_Occurred()) return nullptr;
    self->tokens->push_back(static_cast<int32_t>(token));
    read_token(self, static_cast<int32_t>(token));
    size_t read = self->tokens->size();
    if (read - self->checkpoints->back().first >= CHECKPOINT) self->checkpoints->emplace_back(read, *self->reader);
    Py_CLEAR(self->answer);
    Py_RETURN_NONE;
}

PyObject* memory_rollback(MemoryObject* self, PyObject* arg) {
    long count = PyLong_AsLong(arg);
    if (count == -1 && PyErr_Occurred()) return nullptr;
    if (count <= 0) Py_RETURN_NONE;
    size_t target = self->tokens->size() > static_cast<size_t>(count) ? self->tokens->size() - count : 0;
    self->tokens->resize(target);
    auto& saved = *self->checkpoints;
    while (saved.size() > 1 && saved.back().first > target) saved.pop_back();
    *self->reader = saved.back().second;
    for (size_t at = saved.back().first; at < target; ++at) read_token(self, (*self->tokens)[at]);
    Py_CLEAR(self->answer);
    Py_RETURN_NONE;
}

// Whether reading ``token`` from the reader's state completes a key its object has.
bool repeats(const Reader& reader, const Vocab& vocab, int32_t token) {
    if (!vocab.has_text[token]) return false;
    Reader scratch = reader;
    scratch.repeated = false;
    scratch.push(vocab.texts[token], vocab);
    return scratch.repeated;
}

PyObject* memory_banned(MemoryObject* self, PyObject*) {
    if (self->answer) {
        Py_INCREF(self->answer);
        return self->answer;
    }
    const Reader& reader = *self->reader;
    const Vocab& vocab = *self->owner->vocab;
    Ids found;
    Ids unsure = vocab.quadruple;
    if (!reader.broken && !reader.stack.empty()) {
        const Frame& top = reader.stack.back();
        if (top.kind == OBJECT && top.state == KEY && !top.keys.empty()) {
            const std::string& raw = top.raw;
            if (top.backslash || top.hex_left || raw.find('\\') != std::string::npos) {
                unsure.insert(unsure.end(), vocab.quoted.begin(), vocab.quoted.end());
            } else {
                for (const std::string& key : top.keys) {
                    if (key.size() < raw.size() || key.compare(0, raw.size(), raw) != 0) continue;
                    auto hit = vocab.heads.find(key.substr(raw.size()));
                    if (hit != vocab.heads.end()) found.insert(found.end(), hit->second.begin(), hit->second.end());
                }
                unsure.insert(unsure.end(), vocab.escaped_heads.begin(), vocab.escaped_heads.end());
            }
        }
        for (const Frame& frame : reader.stack) {
            if (!frame.marked) continue;
            for (const std::string& key : frame.keys) {
                auto hit = vocab.segments.find(key);
                if (hit != vocab.segments.end()) unsure.insert(unsure.end(), hit->second.begin(), hit->second.end());
            }
        }
    }
    if (!reader.broken && !unsure.empty()) {
        std::sort(unsure.begin(), unsure.end());
        unsure.erase(std::unique(unsure.begin(), unsure.end()), unsure.end());
        for (int32_t token : unsure)
            if (repeats(reader, vocab, token)) found.push_back(token);
    }
    if (found.empty()) {
        self->answer = EMPTY;
        Py_INCREF(EMPTY);
    } else {
        std::sort(found.begin(), found.end());
        found.erase(std::unique(found.begin(), found.end()), found.end());
        self->answer = PyTuple_New(static_cast<Py_ssize_t>(found.size()));
        if (!self->answer) return nullptr;
        for (size_t i = 0; i < found.size(); ++i)
            PyTuple_SET_ITEM(self->answer, i, PyLong_FromLong(found[i]));
    }
    Py_INCREF(self->answer);
    return self->answer;
}

PyTypeObject MemoryType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* memory_fork(MemoryObject* self, PyObject*) {
    PyObject* args = Py_BuildValue("(O)", self->owner);
    if (!args) return nullptr;
    PyObject* twin = PyObject_Call(reinterpret_cast<PyObject*>(&MemoryType), args, nullptr);
    Py_DECREF(args);
    if (!twin) return nullptr;
    auto copy = reinterpret_cast<MemoryObject*>(twin);
    *copy->reader = *self->reader;
    *copy->tokens = *self->tokens;
    *copy->checkpoints = *self->checkpoints;
    return twin;
}

PyObject* memory_written(MemoryObject* self, PyObject*) {
    PyObject* result = PyList_New(0);
    if (!result) return nullptr;
    for (const Frame& frame : self->reader->stack) {
        if (frame.kind != OBJECT) continue;
        PyObject* keys = PyTuple_New(static_cast<Py_ssize_t>(frame.keys.size()));
        for (size_t i = 0; i < frame.keys.size(); ++i) {
            const std::string& key = frame.keys[i];
            PyObject* text = PyUnicode_DecodeUTF8(key.data(), static_cast<Py_ssize_t>(key.size()), "surrogateescape");
            if (!text) {
                Py_DECREF(keys);
                Py_DECREF(result);
                return nullptr;
            }
            PyTuple_SET_ITEM(keys, i, text);
        }
        PyList_Append(result, keys);
        Py_DECREF(keys);
    }
    return result;
}

PyObject* memory_quoted(MemoryObject* self, void*) { return vocab_quoted(self->owner, nullptr); }

PyMethodDef memory_methods[] = {
    {"advance", reinterpret_cast<PyCFunction>(memory_advance), METH_O, "read one token"},
    {"rollback", reinterpret_cast<PyCFunction>(memory_rollback), METH_O, "undo the last n tokens"},
    {"banned", reinterpret_cast<PyCFunction>(memory_banned), METH_NOARGS,
     "the tokens that would complete a key an open object already has (sorted ids)"},
    {"fork", reinterpret_cast<PyCFunction>(memory_fork), METH_NOARGS, "an independent copy"},
    {"written", reinterpret_cast<PyCFunction>(memory_written), METH_NOARGS,
     "the keys of each open object, outermost first"},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef memory_getset[] = {
    {"quoted_ids", reinterpret_cast<getter>(memory_quoted), nullptr, "the tokens holding a quote", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "proctor_keys", "The key memory, compiled (issue 56).", -1,
                          nullptr, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit_proctor_keys(void) {
    VocabType.tp_name = "proctor_keys.Vocabulary";
    VocabType.tp_basicsize = sizeof(VocabObject);
    VocabType.tp_flags = Py_TPFLAGS_DEFAULT;
    VocabType.tp_new = PyType_GenericNew;
    VocabType.tp_init = reinterpret_cast<initproc>(vocab_init);
    VocabType.tp_dealloc = reinterpret_cast<destructor>(vocab_dealloc);
    VocabType.tp_getset = vocab_getset;
    VocabType.tp_doc = "the quote tokens of a vocabulary, indexed (from each token's bytes, None for no text)";
    MemoryType.tp_name = "proctor_keys.KeyMemory";
    MemoryType.tp_basicsize = sizeof(MemoryObject);
    MemoryType.tp_flags = Py_TPFLAGS_DEFAULT;
    MemoryType.tp_new = PyType_GenericNew;
    MemoryType.tp_init = reinterpret_cast<initproc>(memory_init);
    MemoryType.tp_dealloc = reinterpret_cast<destructor>(memory_dealloc);
    MemoryType.tp_methods = memory_methods;
    MemoryType.tp_getset = memory_getset;
    MemoryType.tp_doc = "one row's key memory over a Vocabulary";
    if (PyType_Ready(&VocabType) < 0 || PyType_Ready(&MemoryType) < 0) return nullptr;
    EMPTY = PyTuple_New(0);
    PyObject* module = PyModule_Create(&module_def);
    if (!module) return nullptr;
    Py_INCREF(&VocabType);
    Py_INCREF(&MemoryType);
    PyModule_AddObject(module, "Vocabulary", reinterpret_cast<PyObject*>(&VocabType));
    PyModule_AddObject(module, "KeyMemory", reinterpret_cast<PyObject*>(&MemoryType));
    return module;
}
