#!/usr/bin/env python3
"""Malicious pickles in .pth checkpoints (issue #14): maskd refuses each with a clear message and runs
nothing.

Every payload is written opcode by opcode (struct + pickle's opcode bytes; pickletools checks that
it is well-formed) into a zip in torch.save's layout (archive/data.pkl, archive/version), never made
by pickling a live object. A payload that would run code creates a marker file when it runs. For each
such payload the test first proves that it is live: Python's own pickle.loads, in a child process,
does create the marker. Then `maskd --checkpoint FILE` must exit non-zero, print the expected
refusal, and leave no marker behind.

Run by ctest (hardening_pickle_test) with MASKD_PYTHON.
Usage: hardening_pickle_test.py --maskd PATH_TO_MASKD
"""
import argparse
import os
import pickletools
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile

MASKD = None


def unicode_(s):
    """BINUNICODE: 'X', a 4-byte little-endian length, UTF-8 bytes."""
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def global_(module, name):
    """GLOBAL: 'c' module '\\n' name '\\n' (protocols 0-3)."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def stack_global(module, name):
    """Protocol 4's STACK_GLOBAL (0x93): module and name strings from the stack."""
    return unicode_(module) + unicode_(name) + b"\x93"


PROTO2 = b"\x80\x02"
PROTO4 = b"\x80\x04"
MARK, TUPLE, TUPLE1, REDUCE, STOP = b"(", b"t", b"\x85", b"R", b"."
EMPTY_DICT, EMPTY_TUPLE, SETITEM, BUILD, LIST = b"}", b")", b"s", b"b", b"l"


def shell(marker):
    return "touch '%s'" % marker


def payloads(marker):
    """name -> (pickle bytes, whether it runs code under Python's pickle, text maskd must print)."""
    py_create = "open(%r, 'w').close()" % marker
    os_system = global_("os", "system") + unicode_(shell(marker)) + TUPLE1 + REDUCE
    return {
        # The classic: os.system(cmd) through GLOBAL + REDUCE.
        "os_system": (PROTO2 + os_system + STOP, True, "'os.system'"),
        # The same function under its POSIX module name.
        "posix_system": (PROTO2 + global_("posix", "system") + unicode_(shell(marker)) + TUPLE1 + REDUCE
                         + STOP, True, "'posix.system'"),
        # exec of Python source (py3's builtins), and the same through STACK_GLOBAL (protocol 4).
        "builtins_exec": (PROTO2 + global_("builtins", "exec") + unicode_(py_create) + TUPLE1 + REDUCE
                          + STOP, True, "'builtins.exec'"),
        "builtins_exec_stack_global": (PROTO4 + stack_global("builtins", "exec") + unicode_(py_create)
                                       + TUPLE1 + REDUCE + STOP, True, "'builtins.exec'"),
        # subprocess.Popen(["touch", marker]): a list argument.
        "subprocess_popen": (PROTO2 + global_("subprocess", "Popen") + MARK + MARK + unicode_("touch")
                             + unicode_(marker) + LIST + TUPLE + REDUCE + STOP, True,
                             "'subprocess.Popen'"),
        # INST ('i' module\\nname\\n): calls os.system with the arguments above its MARK.
        "inst_os_system": (PROTO2 + MARK + unicode_(shell(marker)) + b"ios\nsystem\n" + STOP, True,
                           "'os.system' through INST"),
        # BUILD/__setstate__: an allowed OrderedDict gets os.system as its __setstate__ attribute by a
        # first BUILD; a second BUILD then calls it with the command as the "state".
        "build_setstate": (PROTO2 + global_("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE
                           + EMPTY_DICT + unicode_("__setstate__") + global_("os", "system") + SETITEM
                           + BUILD + unicode_(shell(marker)) + BUILD + STOP, True, "'os.system'"),
        # Nested: os.system buried in a state dict that looks real (an OrderedDict whose value is a
        # tuple holding a dict holding the call).
        "nested_in_state_dict": (PROTO2 + global_("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE
                                 + unicode_("image_encoder.weight") + MARK + EMPTY_DICT
                                 + unicode_("inner") + os_system + SETITEM + TUPLE + SETITEM + STOP,
                                 True, "'os.system'"),
        # Nested: a pickle inside the pickle, unpickled by pickle.loads (which would run the inner one).
        "nested_pickle_loads": (PROTO2 + global_("pickle", "loads") + b"C"
                                + bytes([len(PROTO2 + os_system + STOP)]) + PROTO2 + os_system + STOP
                                + TUPLE1 + REDUCE + STOP, True, "'pickle.loads'"),
        # BUILD on something that is not a dict (no global at all): refused by the BUILD rule.
        "build_on_a_string": (PROTO2 + unicode_("x") + EMPTY_DICT + BUILD + STOP, False,
                              "BUILD on something other than a dict"),
    }


def write_pth(path, pickle_bytes):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")


class MaliciousPickles(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="maskd-pickle-test-")
        self.marker = os.path.join(self.dir.name, "RAN")

    def tearDown(self):
        self.dir.cleanup()

    def wait_for_marker(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if os.path.exists(self.marker):
                return True
            time.sleep(0.05)
        return os.path.exists(self.marker)

    def prove_live(self, name, data):
        """Python's pickle runs the payload: the marker appears (so its absence below means something)."""
        subprocess.run([sys.executable, "-c", "import pickle,sys; pickle.loads(sys.stdin.buffer.read())"],
                       input=data, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
        self.assertTrue(self.wait_for_marker(5), name + ": the payload did not run under pickle.loads")
        os.remove(self.marker)

    def test_every_payload_is_refused_and_nothing_runs(self):
        cases = payloads(self.marker)
        for name, (data, live, expected) in cases.items():
            with self.subTest(name):
                if os.path.exists(self.marker):
                    os.remove(self.marker)  # left by a failed case: each case proves its own
                with open(os.devnull, "w") as sink:
                    pickletools.dis(data, out=sink)  # a well-formed pickle, or this raises
                if live:
                    self.prove_live(name, data)
                pth = os.path.join(self.dir.name, name + ".pth")
                write_pth(pth, data)
                r = subprocess.run([MASKD, "--checkpoint", pth, "--device", "cpu", "--listen", "127.0.0.1:0",
                                    "--warmup", "false", "--shutdown-grace-s", "1"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
                out = r.stdout.decode(errors="replace")
                self.assertNotEqual(r.returncode, 0, name + ": maskd served a malicious checkpoint:\n" + out)
                self.assertIn(expected, out, name)
                self.assertIn(pth, out, name + ": the message does not name the file")
                if "BUILD" not in expected:
                    self.assertIn("refusing to load it", out, name)
                # Popen would run asynchronously: give anything that was started time to show.
                self.assertFalse(self.wait_for_marker(0.5), name + ": the payload ran inside maskd")
        print("%d malicious checkpoints refused, none ran" % len(cases))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--maskd", required=True)
    args, rest = ap.parse_known_args()
    MASKD = args.maskd
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
