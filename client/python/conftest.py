"""pytest setup for the Python client: make `maskd_client` importable from this folder and generate
the protobuf modules when they are missing or stale."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
subprocess.run([sys.executable, os.path.join(HERE, "generate.py"), "--if-needed"], check=True)
