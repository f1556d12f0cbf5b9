"""Small builders shared by the tests."""

from cleaner.trajectory import Observation, Trajectory, Turn

OK = Observation(status="ok", stdout="3\n")


def err(kind: str = "NameError", message: str = "name 'x' is not defined") -> Observation:
    return Observation(status="error", stderr=f"{kind}: {message}", error_type=kind)


def make_trajectory(*turns: Turn, id: str = "t0", saar=None, **extra) -> Trajectory:
    """A trajectory on a fixed prompt; unknown keyword arguments become extra keys of the record."""
    return Trajectory(
        id=id,
        prompt=[{"role": "user", "content": "What is 1+2?"}],
        turns=list(turns),
        saar=saar,
        extra=extra,
    )
