# Which stack runs, on which Python: sourced by setup_env.sh, demo.sh and test.sh. Only bash builtins
# (and the interpreters it asks), so `scripts/demo.sh --which-stack` answers without installing anything.
#
# A stack is picked by the Python it runs on (choose_stack), first of: KERNEL_CACHE_STACK naming one;
# PYTHON=/path/to/python3.X (the stack of its version: 3.11 oldest, 3.12 current, 3.13 current-py313);
# the active Python, an activated venv's or else the python3 on PATH, where its version is supported
# (the one a user has chosen runs the demo, on the newest stack that supports it); else the first stack
# of STACK_PREFERENCE whose Python is found on PATH or among pyenv's versions (CI has 3.12 there, not
# on PATH).

STACK_PREFERENCE="current current-py313 oldest"
ALL_STACKS="oldest current current-py313"

stack_python_version() {
  case "$1" in
    oldest) echo 3.11 ;;
    current) echo 3.12 ;;
    current-py313) echo 3.13 ;;
  esac
}

version_stack() {
  case "$1" in
    3.11) echo oldest ;;
    3.12) echo current ;;
    3.13) echo current-py313 ;;
  esac
}

# The "X.Y" of interpreter $1 (a name on PATH or a path), nothing when it does not run or has no venv module.
python_minor() {
  command -v "$1" >/dev/null 2>&1 && "$1" -c 'import sys, venv; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}

# The active interpreter: an activated venv's python, else the python3 on PATH (its real path, not a
# pyenv shim's); nothing when neither runs.
active_python() {
  local py
  if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then py="$VIRTUAL_ENV/bin/python"
  else py="$(command -v python3 2>/dev/null)" || return 0
  fi
  "$py" -c 'import sys; print(sys.executable)' 2>/dev/null || true
}

# Where the active interpreter ($1, as active_python prints it) comes from, for the demo's first line.
active_python_origin() {
  if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then echo "the activated venv $VIRTUAL_ENV"
  else echo "the python3 on PATH${1:+ ($1)}"
  fi
}

# The interpreter for stack $1 ($PYTHON, else the active one, when it is that version), or nothing
# when this machine has none.
stack_python() {
  local want root candidate active
  want="$(stack_python_version "$1")"
  root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
  active="$(active_python)"
  for candidate in "${PYTHON:-}" "$active" "python$want" "$root"/versions/"$want".*/bin/python; do
    if [ "$(python_minor "$candidate")" = "$want" ]; then
      command -v "$candidate"; return
    fi
  done
}

# The venv of stack $1 in checkout $2 (KERNEL_CACHE_VENV when set), as setup_env.sh makes it.
stack_venv() {
  if [ -n "${KERNEL_CACHE_VENV:-}" ]; then echo "$KERNEL_CACHE_VENV"
  elif [ "$1" = oldest ]; then echo "$2/.venv"
  else echo "$2/.venv-$1"
  fi
}

# Why the active interpreter $1 (of version $2, if it runs) does not pick the stack.
inactive_reason() {
  if [ -n "$2" ]; then echo "$(active_python_origin "$1") is Python $2, which no stack supports"
  elif [ -n "$1" ]; then echo "$(active_python_origin "$1") has no venv module"
  elif [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then echo "the activated venv $VIRTUAL_ENV does not run"
  elif command -v python3 >/dev/null 2>&1; then echo "the python3 on PATH does not run"
  else echo "no python3 on PATH"
  fi
}

# Sets CHOSEN_STACK to the stack to run (see the top) and CHOSEN_WHY to the reason, said after
# "because"; on a conflict or when no supported Python is found, says why on stderr (each line
# starting with $1, the caller's name) and returns 2.
choose_stack() {
  local who="${1:-}" minor stack active
  CHOSEN_STACK="" CHOSEN_WHY=""
  if [ -n "${KERNEL_CACHE_STACK:-}" ] && [[ " $ALL_STACKS " != *" $KERNEL_CACHE_STACK "* ]]; then
    echo "${who}KERNEL_CACHE_STACK=$KERNEL_CACHE_STACK: no such stack (there are: $ALL_STACKS)" >&2; return 2
  fi
  if [ -n "${PYTHON:-}" ]; then
    minor="$(python_minor "$PYTHON")"
    if [ -z "$minor" ]; then
      echo "${who}PYTHON=$PYTHON: not a Python that runs here with its venv module (a pyenv shim runs only its selected versions: name the interpreter's path)" >&2; return 2
    fi
    stack="$(version_stack "$minor")"
    if [ -z "$stack" ]; then
      echo "${who}PYTHON=$PYTHON is Python $minor: the supported ones are 3.11 (oldest stack), 3.12 (current), 3.13 (current-py313)" >&2
      return 2
    fi
    if [ -n "${KERNEL_CACHE_STACK:-}" ] && [ "$KERNEL_CACHE_STACK" != "$stack" ]; then
      echo "${who}PYTHON=$PYTHON is Python $minor, for the $stack stack, but KERNEL_CACHE_STACK=$KERNEL_CACHE_STACK (Python $(stack_python_version "$KERNEL_CACHE_STACK")): unset one of them" >&2
      return 2
    fi
    CHOSEN_STACK="$stack" CHOSEN_WHY="PYTHON=$PYTHON is Python $minor"; return 0
  fi
  if [ -n "${KERNEL_CACHE_STACK:-}" ]; then
    CHOSEN_STACK="$KERNEL_CACHE_STACK" CHOSEN_WHY="KERNEL_CACHE_STACK=$KERNEL_CACHE_STACK"; return 0
  fi
  active="$(active_python)"
  minor="$(python_minor "${active:-/nonexistent}")"
  stack="$(version_stack "$minor")"
  if [ -n "$stack" ]; then
    CHOSEN_STACK="$stack" CHOSEN_WHY="$(active_python_origin "$active") is Python $minor"; return 0
  fi
  for stack in $STACK_PREFERENCE; do
    if [ -n "$(stack_python "$stack")" ]; then
      CHOSEN_STACK="$stack"
      CHOSEN_WHY="Python $(stack_python_version "$stack") is the first found of 3.12, 3.13, 3.11 ($(inactive_reason "$active" "$minor"))"
      return 0
    fi
  done
  echo "${who}no supported Python found on PATH or among pyenv's versions (3.12, 3.13 or 3.11); set PYTHON=/path/to/python3.12" >&2
  return 2
}

# The demo's first line, for stack $1 of checkout $2 chosen because $3: the Python it runs on (the
# venv's, or the one that will make it) and why, then the stack's pins and its venv.
describe_stack() {
  local stack="$1" root="$2" why="$3" venv py pins="" line made=""
  venv="$(stack_venv "$stack" "$root")"
  if [ -x "$venv/bin/python" ]; then py="$venv/bin/python"; else py="$(stack_python "$stack")" made=" (to be made)"; fi
  if [ -f "$root/scripts/stacks/$stack.txt" ]; then
    while IFS= read -r line; do
      case "$line" in jax==*|triton==*|jax-triton==*|ejkernel==*) pins+="${pins:+, }${line/==/ }" ;; esac
    done < "$root/scripts/stacks/$stack.txt"
  fi
  if [ -n "$py" ]; then py="$("$py" -c 'import sys; print("Python %d.%d.%d" % sys.version_info[:3])' 2>/dev/null) (${py#"$root"/})"
  else py="Python $(stack_python_version "$stack") (none found yet)"; fi
  echo "$py because $why: the $stack stack, $pins; venv ${venv#"$root"/}$made"
}
